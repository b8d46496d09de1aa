package node

import (
	"context"
	"testing"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/tribeagent/tribe/node/api"
)

// A call to a node this one was not connected to closes the connection it
// opened once it has ConnLow peers besides, so a fan-out to thousands of
// hosts does not hold a connection to each; one it was connected to stays.
func TestCallClosesTheConnectionItOpened(t *testing.T) {
	ctx := context.Background()
	cfg := func(name string, join ...string) Config {
		c := loopbackConfig(t, name)
		c.DHT, c.ConnLow, c.Join = false, 1, join // only the joins: a and c never meet by themselves
		return c
	}
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
		if a.host.Network().Connectedness(c.ID()) == network.Connected {
			t.Errorf("round %d: a is still connected to c after calling it", round)
		}
		if a.host.Network().Connectedness(b.ID()) != network.Connected {
			t.Errorf("round %d: a dropped b, its join peer", round)
		}
	}
	if got := a.callConnsClosed.Load(); got != 2 {
		t.Errorf("%d call connections closed, want 2", got)
	}
}
