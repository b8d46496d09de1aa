package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeAgent answers Status and Peers; the embedded nil Agent makes any
// other call panic, which the HTTP server turns into a failed request.
type fakeAgent struct {
	Agent
	err     error
	callFor time.Duration // how long Call runs
}

func (f fakeAgent) Join(_ context.Context, _ string, nodes []string) ([]Member, error) {
	var m []Member
	for _, n := range nodes {
		m = append(m, Member{Name: n})
	}
	return m, f.err
}

// Call answers once at once and once after callFor, unless its context
// ends first.
func (f fakeAgent) Call(ctx context.Context, _ CallRequest, emit func(CallResult)) (CallSummary, error) {
	emit(CallResult{Name: "first"})
	select {
	case <-time.After(f.callFor):
	case <-ctx.Done():
		return CallSummary{}, fmt.Errorf("call cancelled after the first answer: %w", ctx.Err())
	}
	emit(CallResult{Name: "second"})
	return CallSummary{Targets: 2, Answered: 2}, f.err
}

func (f fakeAgent) Status(context.Context) (Status, error) {
	return Status{ID: "12D3Koo", Name: "a", Peers: 2}, f.err
}
func (f fakeAgent) Peers(context.Context) ([]Peer, error) {
	return []Peer{{ID: "x", Name: "b"}}, f.err
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func listen(t *testing.T, a Agent, opts ...Option) (*Server, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), SocketName)
	s, err := Listen(path, a, quiet, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	return s, path
}

func TestClientServerRoundTrip(t *testing.T) {
	_, path := listen(t, fakeAgent{})
	c := NewClient(path)
	st, err := c.Status(context.Background())
	if err != nil || st.Name != "a" || st.Peers != 2 {
		t.Fatalf("status: %+v, %v", st, err)
	}
	peers, err := c.Peers(context.Background())
	if err != nil || len(peers) != 1 || peers[0].Name != "b" {
		t.Fatalf("peers: %+v, %v", peers, err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v", fi.Mode().Perm())
	}
}

func TestAgentErrorsReachTheClient(t *testing.T) {
	_, path := listen(t, fakeAgent{err: NotFound(errors.New("no such tribe"))})
	_, err := NewClient(path).Status(context.Background())
	var apiErr *Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound || apiErr.Message != "no such tribe" {
		t.Fatalf("err = %#v", err)
	}
}

func TestUnknownEndpoint(t *testing.T) {
	_, path := listen(t, fakeAgent{})
	err := NewClient(path).do(context.Background(), http.MethodGet, "/v1/nope", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "no endpoint") {
		t.Fatalf("err = %v", err)
	}
}

func TestNoAgent(t *testing.T) {
	path := filepath.Join(t.TempDir(), SocketName)
	_, err := NewClient(path).Status(context.Background())
	if !errors.Is(err, ErrNoAgent) || !strings.Contains(err.Error(), path) {
		t.Fatalf("missing socket: %v", err)
	}
	// A socket file nobody listens on any more (an agent killed with -9).
	ln, _ := net.Listen("unix", path)
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	_, err = NewClient(path).Status(context.Background())
	if !errors.Is(err, ErrNoAgent) {
		t.Fatalf("stale socket: %v", err)
	}
	// ... which a new agent replaces.
	s, err := Listen(path, fakeAgent{}, quiet)
	if err != nil {
		t.Fatalf("listen over a stale socket: %v", err)
	}
	s.Shutdown(context.Background())
}

// The socket at its path is 0600 whatever the umask (it is made 0600 in
// a directory of its own, then moved there), and that directory is gone.
func TestSocketIsPrivateFromTheStart(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	s, path := listen(t, fakeAgent{})
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket: %v %v", fi.Mode(), err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(path), ".sock")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the directory the socket was made in: %v", err)
	}
	if _, err := NewClient(path).Status(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.Shutdown(context.Background())
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after shutdown: %v", err)
	}
}

func TestSecondAgentOnOneSocketIsRefused(t *testing.T) {
	_, path := listen(t, fakeAgent{})
	if _, err := Listen(path, fakeAgent{}, quiet); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("err = %v", err)
	}
}

func TestShutdownRemovesSocket(t *testing.T) {
	s, path := listen(t, fakeAgent{})
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("socket still there: %v", err)
	}
}

// shortLimits make a stalled client's fate visible in milliseconds.
var shortLimits = Limits{HeaderTimeout: 100 * time.Millisecond, BodyTimeout: 100 * time.Millisecond, IdleTimeout: time.Second, MaxBody: 1000}

func TestStalledClientIsCutOff(t *testing.T) {
	_, path := listen(t, fakeAgent{}, WithLimits(shortLimits))
	for _, c := range []struct {
		name, sent, answer string
	}{
		{"in the headers", "POST /v1/tribes/t/join HTTP/1.1\r\nHost: tribe\r\n", ""},
		{"in the body", "POST /v1/tribes/t/join HTTP/1.1\r\nHost: tribe\r\nContent-Length: 100\r\n\r\n{\"nodes\":[", "HTTP/1.1 408"},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, c.sent); err != nil {
				t.Fatal(err)
			}
			// The client now stalls. The server must hang up long before
			// this deadline, which only keeps a failing test from hanging.
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			got, err := io.ReadAll(conn)
			if err != nil {
				t.Fatalf("the server kept a stalled client: %v (read %q)", err, got)
			}
			if !strings.HasPrefix(string(got), c.answer) {
				t.Fatalf("answer %q, want it to start with %q", got, c.answer)
			}
		})
	}
}

func TestBodyOverTheCapIsRefused(t *testing.T) {
	_, path := listen(t, fakeAgent{}, WithLimits(shortLimits))
	_, err := NewClient(path).Join(context.Background(), "t", []string{strings.Repeat("n", 2000)})
	var apiErr *Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusRequestEntityTooLarge || !strings.Contains(apiErr.Message, "over 1000 bytes") {
		t.Fatalf("err = %#v, want 413 naming the cap", err)
	}
	// Below the cap the body reaches the agent.
	m, err := NewClient(path).Join(context.Background(), "t", []string{"a"})
	if err != nil || len(m) != 1 || m[0].Name != "a" {
		t.Fatalf("join under the cap: %v, %v", m, err)
	}
}

// A call runs, and streams, for longer than the body timeout: the body's
// deadline must not reach the answer or the request's context.
func TestLongCallOutlivesTheBodyTimeout(t *testing.T) {
	_, path := listen(t, fakeAgent{callFor: 3 * shortLimits.BodyTimeout}, WithLimits(shortLimits))
	var got []CallResult
	sum, err := NewClient(path).Call(context.Background(), CallRequest{Plugin: "echo", Method: "echo"}, func(r CallResult) { got = append(got, r) })
	if err != nil || sum.Answered != 2 || len(got) != 2 {
		t.Fatalf("call: %+v, %d results, %v", sum, len(got), err)
	}
}

// A body of the wrong shape is refused in plain words, never with the Go
// types it failed to fill.
func TestBadBodyIsRefusedInPlainWords(t *testing.T) {
	_, path := listen(t, fakeAgent{})
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
	resp, err := hc.Post("http://tribe/v1/tribes/t/join", "application/json", strings.NewReader(`{"nodes": "n1"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `field \"nodes\": want a list of text, got text`) || strings.Contains(string(body), "Go ") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// The socket serves Go's profiler and execution tracer (what wakes an
// idle agent shows in a trace, not in a CPU profile).
func TestProfilerAndTracerServed(t *testing.T) {
	_, path := listen(t, fakeAgent{})
	hc := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
	for _, c := range []struct{ path, prefix string }{
		{"/debug/pprof/trace?seconds=0.05", "go 1."},
		{"/debug/pprof/", "<html>"},
	} {
		resp, err := hc.Get("http://tribe" + c.path)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(b), c.prefix) {
			t.Fatalf("GET %s: %s %q %v, want a body starting %q", c.path, resp.Status, b[:min(len(b), 40)], err, c.prefix)
		}
	}
}

// floodAgent's Call answers without end, until its context ends, and
// says when it did.
type floodAgent struct {
	Agent
	ended chan error
}

func (f floodAgent) Call(ctx context.Context, _ CallRequest, emit func(CallResult)) (CallSummary, error) {
	big := CallResult{Name: "n", Error: strings.Repeat("x", 64<<10)}
	for ctx.Err() == nil {
		emit(big)
	}
	f.ended <- ctx.Err()
	return CallSummary{}, ctx.Err()
}

// A call client that stops reading (a CLI suspended with ^Z) does not
// hold the call: past the write deadline it is given up.
func TestCallClientThatStopsReadingEndsTheCall(t *testing.T) {
	defer func(d time.Duration) { watchWriteTimeout = d }(watchWriteTimeout)
	watchWriteTimeout = 200 * time.Millisecond
	a := floodAgent{ended: make(chan error, 1)}
	_, path := listen(t, a)
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"tribes":["t"],"plugin":"echo","method":"echo"}`
	fmt.Fprintf(conn, "POST /v1/call HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	select {
	case err := <-a.ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the call ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a call whose client stopped reading went on")
	}
}
