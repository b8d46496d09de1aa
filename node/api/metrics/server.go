package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Limits of the endpoint: it is reachable from the network, so a slow or
// greedy client is cut off, and scrapes in parallel are few.
const (
	headerTimeout  = 10 * time.Second
	writeTimeout   = 30 * time.Second
	idleTimeout    = 2 * time.Minute
	scrapeTimeout  = 10 * time.Second
	healthTimeout  = 5 * time.Second
	scrapesAtOnce  = 4
	maxHeaderBytes = 16 << 10
)

// CheckAddr reports whether addr is a TCP HOST:PORT to listen on: a host
// (an IP, a name, or empty for every interface) and a port from 0 (any
// free port) to 65535.
func CheckAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("metrics address %q: want HOST:PORT, such as 127.0.0.1:9464 (%v)", addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("metrics address %q: port %q is not a number from 0 to 65535", addr, port)
	}
	return nil
}

// Handler serves GET /metrics from m and GET /healthz from health.
func (m *Metrics) Handler(health Checker, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:            slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: scrapesAtOnce,
		Timeout:             scrapeTimeout,
	}))
	checks := make(chan struct{}, scrapesAtOnce) // bounded like the scrapes: each reads the store
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		select {
		case checks <- struct{}{}:
			defer func() { <-checks }()
		default:
			http.Error(w, "too many health checks at once", http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
		defer cancel()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		h, err := health.Health(ctx)
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(map[string]string{"status": "unavailable", "error": err.Error()})
			return
		}
		h.Status = "ok"
		json.NewEncoder(w).Encode(h)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, fmt.Sprintf("no endpoint %s %s: try GET /metrics or GET /healthz", r.Method, r.URL.Path), http.StatusNotFound)
	})
	return mux
}

// Server serves a handler on a TCP address.
type Server struct {
	ln   net.Listener
	http *http.Server
	done chan struct{}
}

// Listen serves h on addr (HOST:PORT; port 0 picks a free one, see Addr).
func Listen(addr string, h http.Handler, log *slog.Logger) (*Server, error) {
	if err := CheckAddr(addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	s := &Server{
		ln: ln,
		http: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: headerTimeout,
			ReadTimeout:       headerTimeout,
			WriteTimeout:      writeTimeout,
			IdleTimeout:       idleTimeout,
			MaxHeaderBytes:    maxHeaderBytes,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	return s, nil
}

// Addr is the address the server listens on, with the port it got.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Shutdown stops accepting, and waits for requests in flight until ctx
// ends.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.http.Shutdown(ctx)
	<-s.done
	return err
}
