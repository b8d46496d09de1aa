package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"
)

// maxRequestBody caps what a client may send in one request.
const maxRequestBody = 1 << 20

// Server serves an Agent on a Unix socket.
type Server struct {
	path string
	ln   net.Listener
	http *http.Server
	done chan struct{}
}

// Listen opens the socket at path with mode 0600. A stale socket left by an
// agent that died is removed; a socket another live agent answers on is an
// error, so two agents never share a data dir.
func Listen(path string, agent Agent, log *slog.Logger) (*Server, error) {
	if len(path) >= 108 {
		return nil, fmt.Errorf("api: socket path %s is %d bytes, over the 107 a Unix socket allows; use a shorter --data-dir", path, len(path))
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("api: another agent is already running on %s", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("api: remove stale socket %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("api: listen on %s: %w", path, err)
	}
	// The data dir is 0700 already; 0600 on the socket keeps it private
	// even if the directory's mode is loosened.
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("api: chmod %s: %w", path, err)
	}
	s := &Server{
		path: path,
		ln:   ln,
		http: &http.Server{
			Handler:           Handler(agent),
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("api server stopped", "err", err)
		}
	}()
	return s, nil
}

// Path is the socket's path.
func (s *Server) Path() string { return s.path }

// Shutdown stops accepting requests, waits for those in flight until ctx
// ends, and removes the socket file.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.http.Shutdown(ctx)
	<-s.done
	if rmErr := os.Remove(s.path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) && err == nil {
		err = rmErr
	}
	return err
}

// Handler routes API requests to agent. Every endpoint is a row here.
func Handler(agent Agent) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /v1/status", endpoint(func(r *http.Request) (any, error) {
		return agent.Status(r.Context())
	}))
	mux.Handle("GET /v1/peers", endpoint(func(r *http.Request) (any, error) {
		return agent.Peers(r.Context())
	}))
	mux.Handle("GET /v1/nodes", endpoint(func(r *http.Request) (any, error) {
		return agent.Nodes(r.Context(), r.URL.Query().Get("where"))
	}))
	mux.Handle("GET /v1/facts", endpoint(func(r *http.Request) (any, error) {
		return agent.Facts(r.Context(), r.URL.Query().Get("node"))
	}))
	mux.Handle("GET /v1/policies", endpoint(func(r *http.Request) (any, error) {
		return agent.Policies(r.Context())
	}))
	mux.Handle("PUT /v1/policies/{name}", endpoint(func(r *http.Request) (any, error) {
		var p Policy
		if err := decode(r, &p); err != nil {
			return nil, err
		}
		return agent.CreatePolicy(r.Context(), r.PathValue("name"), p.Tribe, p.Expr)
	}))
	mux.Handle("DELETE /v1/policies/{name}", endpoint(func(r *http.Request) (any, error) {
		return agent.DeletePolicy(r.Context(), r.PathValue("name"))
	}))
	mux.Handle("POST /v1/policies/test", endpoint(func(r *http.Request) (any, error) {
		var req ExprRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return agent.TestPolicy(r.Context(), req.Expr)
	}))
	mux.Handle("GET /v1/tribes", endpoint(func(r *http.Request) (any, error) {
		return agent.Tribes(r.Context())
	}))
	mux.Handle("GET /v1/tribes/{tribe}", endpoint(func(r *http.Request) (any, error) {
		return agent.Tribe(r.Context(), r.PathValue("tribe"))
	}))
	mux.Handle("PUT /v1/tribes/{tribe}", endpoint(func(r *http.Request) (any, error) {
		return agent.CreateTribe(r.Context(), r.PathValue("tribe"))
	}))
	mux.Handle("DELETE /v1/tribes/{tribe}", endpoint(func(r *http.Request) (any, error) {
		return agent.DeleteTribe(r.Context(), r.PathValue("tribe"))
	}))
	mux.Handle("POST /v1/tribes/{tribe}/join", endpoint(func(r *http.Request) (any, error) {
		var req NodesRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return agent.Join(r.Context(), r.PathValue("tribe"), req.Nodes)
	}))
	mux.Handle("POST /v1/tribes/{tribe}/leave", endpoint(func(r *http.Request) (any, error) {
		var req NodesRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return agent.Leave(r.Context(), r.PathValue("tribe"), req.Nodes)
	}))
	mux.Handle("GET /v1/plugins", endpoint(func(r *http.Request) (any, error) {
		return agent.Plugins(r.Context(), r.URL.Query().Get("tribe"))
	}))
	mux.Handle("PUT /v1/tribes/{tribe}/plugins/{plugin}", endpoint(func(r *http.Request) (any, error) {
		var req LoadRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return agent.LoadPlugin(r.Context(), r.PathValue("plugin"), r.PathValue("tribe"), req)
	}))
	mux.Handle("DELETE /v1/tribes/{tribe}/plugins/{plugin}", endpoint(func(r *http.Request) (any, error) {
		return agent.UnloadPlugin(r.Context(), r.PathValue("plugin"), r.PathValue("tribe"))
	}))
	mux.Handle("POST /v1/call", callHandler(agent))
	mux.Handle("POST /v1/admit", endpoint(func(r *http.Request) (any, error) {
		var req AdmitRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return agent.Admit(r.Context(), req.Nodes, req.AllPending)
	}))
	mux.Handle("POST /v1/revoke", endpoint(func(r *http.Request) (any, error) {
		var req NodesRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return agent.Revoke(r.Context(), req.Nodes)
	}))
	// Go's profiler, for operators chasing memory or CPU; the socket is
	// private to the agent's user.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Errorf("no endpoint %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// Error is an error the agent answered with; clients get it back as is.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string { return e.Message }

// BadRequest marks err as the caller's fault (HTTP 400): the CLI shows the
// message as is.
func BadRequest(err error) error { return &Error{Status: http.StatusBadRequest, Message: err.Error()} }

// NotFound marks err as naming something that does not exist (HTTP 404).
func NotFound(err error) error { return &Error{Status: http.StatusNotFound, Message: err.Error()} }

// endpoint adapts a function returning a value or an error to a handler
// that writes JSON.
func endpoint(f func(r *http.Request) (any, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxRequestBody)
		v, err := f(r)
		if err != nil {
			status := http.StatusInternalServerError
			var apiErr *Error
			if errors.As(err, &apiErr) {
				status = apiErr.Status
			}
			writeError(w, status, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	})
}

// callHandler streams a call's results as JSON lines, flushed one by one,
// so the CLI shows each node's answer as it arrives. Errors before the
// first result are ordinary error responses.
func callHandler(agent Agent) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxRequestBody)
		var req CallRequest
		if err := decode(r, &req); err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		flusher, _ := w.(http.Flusher)
		enc := json.NewEncoder(w)
		started := false
		line := func(l callLine) {
			if !started {
				w.Header().Set("Content-Type", "application/x-ndjson")
				w.WriteHeader(http.StatusOK)
				started = true
			}
			enc.Encode(l)
			if flusher != nil {
				flusher.Flush()
			}
		}
		sum, err := agent.Call(r.Context(), req, func(res CallResult) { line(callLine{Node: &res}) })
		switch {
		case err != nil && !started:
			status := http.StatusInternalServerError
			var apiErr *Error
			if errors.As(err, &apiErr) {
				status = apiErr.Status
			}
			writeError(w, status, err)
		case err != nil:
			line(callLine{Error: err.Error()})
		default:
			line(callLine{Summary: &sum})
		}
	})
}

// decode reads a JSON request body; anything malformed is the caller's
// fault.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return BadRequest(fmt.Errorf("bad request body: %w", err))
	}
	return nil
}

func writeError(w http.ResponseWriter, status int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(errorBody{Error: err.Error()})
}
