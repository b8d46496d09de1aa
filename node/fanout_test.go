package node

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins"
)

// A call to a node this one was not connected to closes the connection it
// opened once it has ConnLow peers besides, so a fan-out to thousands of
// hosts does not hold a connection to each; one it was connected to stays.
func TestCallClosesTheConnectionItOpened(t *testing.T) {
	ctx := context.Background()
	cfg := func(name string, join ...string) Config { return joinsOnly(t, name, join...) }
	b := startNode(t, cfg("b"))
	a := startNode(t, cfg("a", tcpAddr(b)))
	c := startNode(t, cfg("c", tcpAddr(b)))
	waitFor(t, "a to know c", func() bool { return len(a.nodeRecords()) == 3 })
	if _, err := a.CreateTribe(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Join(ctx, "t", []string{"a", "b", "c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.LoadPlugin(ctx, "echo", "t", api.LoadRequest{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "echo loaded on b and c, as a sees it", func() bool {
		s := pluginStates(a, "t")
		return s["b"] == "loaded" && s["c"] == "loaded"
	})
	if a.host.Network().Connectedness(c.ID()) == network.Connected {
		t.Skip("a found c by itself: nothing to test") // no DHT, no mDNS: not expected
	}
	for round := range 2 {
		var got []api.CallResult
		sum, err := a.Call(ctx, api.CallRequest{Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Args: []byte(`"hi"`)},
			func(r api.CallResult) { got = append(got, r) })
		if err != nil || sum.Answered != 3 {
			t.Fatalf("round %d: %+v %v: %+v", round, sum, err, got)
		}
		// A probe of c under way on the connection closes it when it ends.
		waitFor(t, "a to close the connection to c after calling it", func() bool {
			return a.host.Network().Connectedness(c.ID()) != network.Connected
		})
		if a.host.Network().Connectedness(b.ID()) != network.Connected {
			t.Errorf("round %d: a dropped b, its join peer", round)
		}
	}
	if got := a.callConnsClosed.Load(); got != 2 {
		t.Errorf("%d call connections closed, want 2", got)
	}
}

// tokenPlugin's calls each wait for a token (or their end).
type tokenPlugin struct{ started, tokens chan struct{} }

func (*tokenPlugin) Name() string       { return "token" }
func (*tokenPlugin) Version() string    { return "1" }
func (*tokenPlugin) Kind() plugins.Kind { return plugins.Processor }
func (*tokenPlugin) Methods() []string  { return []string{"wait"} }
func (p *tokenPlugin) Call(ctx context.Context, _ string, _ json.RawMessage) (json.RawMessage, error) {
	p.started <- struct{}{}
	select {
	case <-p.tokens:
		return json.RawMessage(`"through"`), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// within receives from ch, or fails the test after a generous while.
func within[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// joinsOnly is a loopback config that meets only its joins (no DHT) and
// keeps one peer besides those it calls (ConnLow 1): a and c, both
// joining b, never meet by themselves.
func joinsOnly(t *testing.T, name string, join ...string) Config {
	c := loopbackConfig(t, name)
	c.DHT, c.ConnLow, c.Join = false, 1, join
	return c
}

// Two overlapping calls to a node share the connection the first opened:
// it is closed when the last ends, not under the other (which the callee
// then answered gone).
func TestOverlappingCallsKeepTheConnectionOneOpened(t *testing.T) {
	ctx := context.Background()
	cfg := func(name string, join ...string) Config { return joinsOnly(t, name, join...) }
	b := startNode(t, cfg("b"))
	a := startNode(t, cfg("a", tcpAddr(b)))
	tp := &tokenPlugin{started: make(chan struct{}, 2), tokens: make(chan struct{})}
	reg := plugins.Builtins(plugins.Env{})
	reg.Register("token", func(map[string]string) (plugins.Plugin, error) { return tp, nil })
	c := startNodeDeps(t, cfg("c", tcpAddr(b)), Deps{Plugins: reg})
	waitFor(t, "a to know c", func() bool { return len(a.nodeRecords()) == 3 })
	if _, err := a.CreateTribe(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Join(ctx, "t", []string{"a", "b", "c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.LoadPlugin(ctx, "token", "t", api.LoadRequest{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "token loaded on c, as a sees it", func() bool { return pluginStates(a, "t")["c"] == "loaded" })
	if a.host.Network().Connectedness(c.ID()) == network.Connected {
		t.Skip("a found c by itself: nothing to test") // no DHT, no mDNS: not expected
	}
	results := make(chan api.CallResult, 2)
	call := func() {
		a.Call(ctx, api.CallRequest{Nodes: []string{"c"}, Plugin: "token", Method: "wait", Timeout: time.Minute},
			func(r api.CallResult) { results <- r })
	}
	go call() // dials c
	within(t, "the first call to start on c", tp.started)
	if a.host.Network().Connectedness(c.ID()) != network.Connected {
		t.Fatal("a is not connected to c while calling it")
	}
	go call() // on the connection the first opened
	within(t, "the second call to start on c", tp.started)
	tp.tokens <- struct{}{}
	if r := within(t, "a call to end", results); !r.OK {
		t.Fatalf("the call released first: %+v", r)
	}
	tp.tokens <- struct{}{}
	if r := within(t, "the other call to end", results); !r.OK {
		t.Fatalf("the call still running when the other ended: %+v", r)
	}
	waitFor(t, "the connection to c to be closed after the last call", func() bool {
		return a.host.Network().Connectedness(c.ID()) != network.Connected
	})
	if got := a.callConnsClosed.Load(); got != 1 {
		t.Errorf("%d call connections closed, want 1", got)
	}
}
