package api

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeAgent answers Status and Peers; the embedded nil Agent makes any
// other call panic, which the HTTP server turns into a failed request.
type fakeAgent struct {
	Agent
	err error
}

func (f fakeAgent) Status(context.Context) (Status, error) {
	return Status{ID: "12D3Koo", Name: "a", Peers: 2}, f.err
}
func (f fakeAgent) Peers(context.Context) ([]Peer, error) {
	return []Peer{{ID: "x", Name: "b"}}, f.err
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func listen(t *testing.T, a Agent) (*Server, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), SocketName)
	s, err := Listen(path, a, quiet)
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
