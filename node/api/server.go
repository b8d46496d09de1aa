package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"time"

	"github.com/tribeagent/tribe/node/api/events"
	"github.com/tribeagent/tribe/plugins/jsonerr"
)

// Limits bound what one client of the socket may hold: a client that
// stalls mid-request is cut off, and a body past MaxBody is refused. A
// zero timeout means none.
type Limits struct {
	// HeaderTimeout is how long a client has to send a request's headers.
	HeaderTimeout time.Duration
	// BodyTimeout is how long it then has to send the body. It covers the
	// body only: the answer (a `tribe call` streams for as long as the
	// call runs) has no deadline, and neither has the request's context.
	BodyTimeout time.Duration
	// IdleTimeout closes a kept-alive connection that sends no request.
	IdleTimeout time.Duration
	// MaxBody caps a request body; past it the answer is 413. It must be
	// positive.
	MaxBody int64
}

// DefaultLimits are the limits of the agent's socket.
func DefaultLimits() Limits {
	return Limits{HeaderTimeout: 10 * time.Second, BodyTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxBody: 1 << 20}
}

// Option is an optional setting of Listen.
type Option func(*Limits)

// WithLimits replaces DefaultLimits (tests shorten the timeouts).
func WithLimits(l Limits) Option { return func(dst *Limits) { *dst = l } }

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
func Listen(path string, agent Agent, log *slog.Logger, opts ...Option) (*Server, error) {
	limits := DefaultLimits()
	for _, o := range opts {
		o(&limits)
	}
	if limits.MaxBody <= 0 {
		return nil, fmt.Errorf("api: request body cap %d: want a positive number of bytes", limits.MaxBody)
	}
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
	// The data dir is 0700 already; 0600 on the socket keeps it private
	// even if the directory's mode is loosened.
	ln, err := listenPrivate(path)
	if err != nil {
		return nil, fmt.Errorf("api: listen on %s: %w", path, err)
	}
	s := &Server{
		path: path,
		ln:   ln,
		// No WriteTimeout: it would cut a `tribe call` that streams for
		// minutes. No ReadTimeout either: the body gets its own deadline in
		// readBody, which answers a stalled or oversized body with a clear
		// 408 or 413 instead of a bare i/o timeout.
		http: &http.Server{
			Handler:           handler(agent, limits),
			ReadHeaderTimeout: limits.HeaderTimeout,
			IdleTimeout:       limits.IdleTimeout,
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
// listenPrivate listens on a Unix socket at path that only this user may
// connect to from the first moment: bound in a directory of its own
// (mode 0700) beside path, made 0600 there, then renamed into place.
// Bound at path, the socket had the umask's mode until a chmod after it:
// with a umask of 0 and a data dir others may enter, anyone on the host
// could connect in between. The directory's name is short, so the
// socket's path there is no longer than path (a Unix socket's is at most
// 107 bytes).
func listenPrivate(path string) (net.Listener, error) {
	dir := filepath.Join(filepath.Dir(path), ".sock")
	tmp := filepath.Join(dir, "s")
	if err := os.RemoveAll(dir); err != nil { // a crashed agent's
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, err
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false) // Shutdown removes path
	if err = os.Chmod(tmp, 0o600); err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

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

// Handler routes API requests to agent under DefaultLimits.
func Handler(agent Agent) http.Handler { return handler(agent, DefaultLimits()) }

// handler routes API requests to agent. Every endpoint is a row here.
func handler(agent Agent, limits Limits) http.Handler {
	mux := http.NewServeMux()
	endpoint := func(f func(r *http.Request) (any, error)) http.Handler { return jsonHandler(limits, f) }
	mux.Handle("GET /v1/status", endpoint(func(r *http.Request) (any, error) {
		return agent.Status(r.Context())
	}))
	mux.Handle("GET /v1/peers", endpoint(func(r *http.Request) (any, error) {
		return agent.Peers(r.Context())
	}))
	mux.Handle("GET /v1/nodes", endpoint(func(r *http.Request) (any, error) {
		q := r.URL.Query()
		if q.Get("facts") == "1" {
			return agent.NodesWithFacts(r.Context(), q.Get("where"))
		}
		return agent.Nodes(r.Context(), q.Get("where"))
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
	mux.Handle("POST /v1/call", callHandler(agent, limits))
	mux.Handle("POST /v1/admit", endpoint(func(r *http.Request) (any, error) {
		var req AdmitRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return agent.Admit(r.Context(), req)
	}))
	mux.Handle("POST /v1/revoke", endpoint(func(r *http.Request) (any, error) {
		var req NodesRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return agent.Revoke(r.Context(), req.Nodes)
	}))
	mux.Handle("GET /v1/watch", watchHandler(agent))
	mux.Handle("POST /v1/leave", endpoint(func(r *http.Request) (any, error) {
		return agent.LeaveCluster(r.Context())
	}))
	mux.Handle("PUT /v1/tribes/{tribe}/tasks", endpoint(func(r *http.Request) (any, error) {
		var req TaskRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return agent.CreateTask(r.Context(), r.PathValue("tribe"), req)
	}))
	mux.Handle("GET /v1/tasks", endpoint(func(r *http.Request) (any, error) {
		return agent.Tasks(r.Context(), r.URL.Query().Get("tribe"))
	}))
	mux.Handle("GET /v1/tasks/{name}", endpoint(func(r *http.Request) (any, error) {
		return agent.Task(r.Context(), r.PathValue("name"))
	}))
	mux.Handle("GET /v1/tasks/{name}/watch", streamHandler(func(r *http.Request, emit func(*TaskRun)) error {
		return agent.WatchTask(r.Context(), r.PathValue("name"), emit)
	}))
	mux.Handle("POST /v1/tasks/{name}/stop", endpoint(func(r *http.Request) (any, error) {
		return agent.SetTaskStopped(r.Context(), r.PathValue("name"), true)
	}))
	mux.Handle("POST /v1/tasks/{name}/start", endpoint(func(r *http.Request) (any, error) {
		return agent.SetTaskStopped(r.Context(), r.PathValue("name"), false)
	}))
	mux.Handle("DELETE /v1/tasks/{name}", endpoint(func(r *http.Request) (any, error) {
		return agent.DeleteTask(r.Context(), r.PathValue("name"))
	}))
	mux.Handle("POST /v1/jobs", endpoint(func(r *http.Request) (any, error) {
		var req JobRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return agent.SubmitJob(r.Context(), req)
	}))
	mux.Handle("GET /v1/jobs", endpoint(func(r *http.Request) (any, error) {
		return agent.Jobs(r.Context(), r.URL.Query().Get("tribe"))
	}))
	mux.Handle("GET /v1/jobs/{id}", endpoint(func(r *http.Request) (any, error) {
		return agent.Job(r.Context(), r.PathValue("id"))
	}))
	mux.Handle("POST /v1/jobs/{id}/cancel", endpoint(func(r *http.Request) (any, error) {
		return agent.CancelJob(r.Context(), r.PathValue("id"))
	}))
	mux.Handle("GET /v1/jobs/{id}/output/{node}", endpoint(func(r *http.Request) (any, error) {
		return agent.JobOutput(r.Context(), r.PathValue("id"), r.PathValue("node"))
	}))
	mux.Handle("GET /v1/jobs/{id}/wait", streamHandler(func(r *http.Request, emit func(*JobTarget)) error {
		return agent.WaitJob(r.Context(), r.PathValue("id"), emit)
	}))
	mux.Handle("POST /v1/reload", endpoint(func(r *http.Request) (any, error) {
		return agent.Reload(r.Context())
	}))
	mux.Handle("POST /v1/force-leave", endpoint(func(r *http.Request) (any, error) {
		var req NodesRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return agent.ForceLeave(r.Context(), req.Nodes)
	}))
	// Go's profiler and execution tracer, for operators chasing memory,
	// CPU or wake-ups; the socket is private to the agent's user.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
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

// status is the HTTP status of an error from the agent: its own if it is
// an *Error, else 500.
func status(err error) int {
	var apiErr *Error
	if errors.As(err, &apiErr) {
		return apiErr.Status
	}
	return http.StatusInternalServerError
}

// readBody reads the whole request body, at most l.MaxBody bytes within
// l.BodyTimeout, before the handler runs; the handler reads it from
// memory. Once the body is in, the read deadline is lifted, so it never
// reaches the answer or the request's context (net/http lifts it too when
// it starts watching for the client to hang up; this does not rely on
// it). After a failed read it stays: the server would otherwise wait, with
// no deadline, to drain the rest of a stalled body before answering.
func readBody(w http.ResponseWriter, r *http.Request, l Limits) error {
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	rc := http.NewResponseController(w)
	deadline := l.BodyTimeout > 0 && rc.SetReadDeadline(time.Now().Add(l.BodyTimeout)) == nil
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, l.MaxBody))
	var tooLarge *http.MaxBytesError
	var netErr net.Error
	switch {
	case errors.As(err, &tooLarge):
		return &Error{Status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("request body over %d bytes", tooLarge.Limit)}
	case errors.As(err, &netErr) && netErr.Timeout():
		return &Error{Status: http.StatusRequestTimeout, Message: fmt.Sprintf("request body not sent within %v", l.BodyTimeout)}
	case err != nil:
		return BadRequest(fmt.Errorf("reading the request body: %w", err))
	}
	if deadline {
		rc.SetReadDeadline(time.Time{})
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	return nil
}

// jsonHandler adapts a function returning a value or an error to a handler
// that writes JSON.
func jsonHandler(l Limits, f func(r *http.Request) (any, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := readBody(w, r, l); err != nil {
			writeError(w, status(err), err)
			return
		}
		v, err := f(r)
		if err != nil {
			writeError(w, status(err), err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	})
}

// callHandler streams a call's results as JSON lines, flushed one by one,
// so the CLI shows each node's answer as it arrives. Errors before the
// first result are ordinary error responses.
func callHandler(agent Agent, l Limits) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req CallRequest
		if err := readBody(w, r, l); err != nil {
			writeError(w, status(err), err)
			return
		}
		if err := decode(r, &req); err != nil {
			writeError(w, status(err), err)
			return
		}
		flusher, _ := w.(http.Flusher)
		enc := json.NewEncoder(w)
		rc := http.NewResponseController(w)
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		started := false
		line := func(l callLine) {
			// A client that stops reading (a CLI suspended with ^Z) must
			// not hold the fan-out, and the connections it keeps, in a
			// write: past the deadline the call is given up.
			rc.SetWriteDeadline(time.Now().Add(watchWriteTimeout))
			if !started {
				w.Header().Set("Content-Type", "application/x-ndjson")
				w.WriteHeader(http.StatusOK)
				started = true
			}
			err := enc.Encode(l)
			if err == nil && flusher != nil {
				err = rc.Flush()
			}
			if err != nil {
				cancel()
			}
		}
		sum, err := agent.Call(ctx, req, func(res CallResult) { line(callLine{Node: &res}) })
		switch {
		case err != nil && !started:
			writeError(w, status(err), err)
		case err != nil:
			line(callLine{Error: err.Error()})
		default:
			line(callLine{Summary: &sum})
		}
	})
}

// watchHandler streams events as JSON lines, flushed one by one, for as
// long as the client stays. The header goes out once the agent has
// subscribed (its first call of emit, with nil), so a client that has it
// misses nothing from then on.
// watchWriteTimeout bounds how long one event may take to reach a watch
// client; one that stops reading is cut off after it.
var watchWriteTimeout = 10 * time.Second

func watchHandler(agent Agent) http.Handler {
	return streamHandler(func(r *http.Request, emit func(*events.Event)) error {
		return agent.Watch(r.Context(), r.URL.Query().Get("prefix"), emit)
	})
}

// streamHandler serves run's items as NDJSON lines {"event": ...} as they
// come (a nil item only flushes the headers), and an error that ends the
// stream as a last line {"error": ...}, or as a plain error before the
// first item.
func streamHandler[T any](run func(r *http.Request, emit func(*T)) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		flusher, _ := w.(http.Flusher)
		enc := json.NewEncoder(w)
		started := false
		start := func() {
			if !started {
				started = true
				w.Header().Set("Content-Type", "application/x-ndjson")
				w.WriteHeader(http.StatusOK)
			}
		}
		rc := http.NewResponseController(w)
		err := run(r, func(e *T) {
			// A client that stops reading must not hold the handler (and
			// the agent's shutdown) in a write for ever.
			rc.SetWriteDeadline(time.Now().Add(watchWriteTimeout))
			start()
			if e != nil {
				enc.Encode(streamLine[T]{Event: e})
			}
			if flusher != nil {
				flusher.Flush()
			}
		})
		switch {
		case err != nil && !started:
			writeError(w, status(err), err)
		case err != nil && r.Context().Err() == nil:
			enc.Encode(streamLine[T]{Error: err.Error()})
		case err == nil && r.Context().Err() == nil:
			start()
			enc.Encode(streamLine[T]{End: true})
		}
	})
}

// decode reads a JSON request body; anything malformed is the caller's
// fault.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return BadRequest(fmt.Errorf("bad request body: %w", jsonerr.Plain(err)))
	}
	return nil
}

func writeError(w http.ResponseWriter, status int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(errorBody{Error: err.Error()})
}
