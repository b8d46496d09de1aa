package node

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/node/api"
)

func TestRelayPlan(t *testing.T) {
	ids := map[string]peer.ID{}
	id := func(name string) peer.ID {
		if _, ok := ids[name]; !ok {
			ids[name] = peer.ID(name)
		}
		return ids[name]
	}
	targets := func(names ...string) []callTarget {
		var out []callTarget
		for _, n := range names {
			out = append(out, callTarget{id: id(n), name: n})
		}
		return out
	}
	far := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("f%03d", i))
		}
		return out
	}
	names := func(ts []callTarget) []string {
		var out []string
		for _, t := range ts {
			out = append(out, t.name)
		}
		return out
	}
	connected := func(p peer.ID) bool { return p[0] == 'c' }
	for _, c := range []struct {
		name        string
		targets     []string
		from        int
		direct, far int
		relays      []string
	}{
		{"few far: all direct", append([]string{"self", "c1"}, far(3)...), 4, 5, 0, nil},
		{"off", append([]string{"c1"}, far(100)...), 0, 101, 0, nil},
		{"no relay", far(100), 4, 100, 0, nil},
		{"relayed", append([]string{"c2", "self", "c1"}, far(30)...), 4, 3, 30, []string{"c2", "c1"}},
	} {
		direct, fars, relays := relayPlan(targets(c.targets...), id("self"), connected, c.from)
		var rs []string
		for _, r := range relays {
			rs = append(rs, string(r))
		}
		if len(direct) != c.direct || len(fars) != c.far || !slices.Equal(rs, c.relays) {
			t.Errorf("%s: %d direct, %d far, relays %v; want %d, %d, %v", c.name, len(direct), len(fars), rs, c.direct, c.far, c.relays)
		}
	}
	relays := func(n int) []peer.ID {
		var out []peer.ID
		for i := range n {
			out = append(out, id(fmt.Sprintf("c%d", i)))
		}
		return out
	}
	for _, c := range []struct {
		name            string
		targets, relays int
		per             []int
		left            int
	}{
		{"shared evenly", 30, 3, []int{10, 10, 10}, 0},
		{"at least relayMinBatch each", 6, 4, []int{4, 2}, 0},
		{"at most relayBatch each", 200, 2, []int{relayBatch, relayBatch}, 200 - 2*relayBatch},
	} {
		groups, left := shareOut(targets(far(c.targets)...), relays(c.relays))
		var per []int
		seen := map[string]bool{}
		for _, g := range groups {
			per = append(per, len(g.targets))
			for _, n := range names(g.targets) {
				seen[n] = true
			}
		}
		for _, n := range names(left) {
			seen[n] = true
		}
		if !slices.Equal(per, c.per) || len(left) != c.left || len(seen) != c.targets {
			t.Errorf("%s: groups %v, %d left, %d of %d targets; want %v, %d", c.name, per, len(left), len(seen), c.targets, c.per, c.left)
		}
	}
}

// A fan-out from a node that holds a connection to one member only
// reaches the others through it: every target answers, those it is not
// connected to through the relay, and the caller opens no connection to
// them.
func TestFanOutThroughARelay(t *testing.T) {
	ctx := context.Background()
	cfg := func(name string, join ...string) Config {
		c := joinsOnly(t, name, join...)
		c.CallRelayFrom = 2
		return c
	}
	hub := startNode(t, cfg("hub"))
	a := startNode(t, cfg("a", tcpAddr(hub)))
	var far []*Node
	for i := range 4 {
		far = append(far, startNode(t, cfg(fmt.Sprintf("f%d", i), tcpAddr(hub))))
	}
	waitFor(t, "a to know every node", func() bool { return len(a.nodeRecords()) == 6 })
	if _, err := a.CreateTribe(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Join(ctx, "t", []string{"a", "hub", "f0", "f1", "f2", "f3"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.LoadPlugin(ctx, "echo", "t", api.LoadRequest{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "echo loaded on every member, as a sees it", func() bool {
		s := pluginStates(a, "t")
		for _, n := range []string{"hub", "f0", "f1", "f2", "f3"} {
			if s[n] != "loaded" {
				return false
			}
		}
		return true
	})
	var unconnected []peer.ID
	for _, f := range far {
		if a.host.Network().Connectedness(f.ID()) != network.Connected {
			unconnected = append(unconnected, f.ID())
		}
	}
	if len(unconnected) < 2 {
		t.Skip("a found the others by itself: nothing to relay") // no DHT, no mDNS: not expected
	}
	var got []api.CallResult
	sum, err := a.Call(ctx, api.CallRequest{Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Args: []byte(`"hi"`)},
		func(r api.CallResult) { got = append(got, r) })
	if err != nil || sum.Answered != 6 {
		t.Fatalf("%+v %v: %+v", sum, err, got)
	}
	for _, r := range got {
		if string(r.Result) != `"hi"` || r.Tribe != "t" || r.Name == "" {
			t.Errorf("%+v", r)
		}
	}
	if n := a.callsRelayed.Load(); n != int64(len(unconnected)) {
		t.Errorf("%d answers came through the relay, want %d", n, len(unconnected))
	}
	if n := a.callsRelayedAgain.Load(); n != 0 {
		t.Errorf("%d targets called again directly", n)
	}
	// The hub, connected, got the call as an order, directly.
	if n := hub.relay.Ran(); n != 1 {
		t.Errorf("the hub ran %d orders, want 1", n)
	}
	if n := a.callConnsClosed.Load(); n != 0 {
		t.Errorf("a opened and closed %d connections for the call", n)
	}
}
