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
		name    string
		targets []string
		from    int
		direct  int   // targets called directly
		groups  []int // targets per relay
	}{
		{"few far: all direct", append([]string{"self", "c1"}, far(3)...), 4, 5, nil},
		{"off", append([]string{"c1"}, far(100)...), 0, 101, nil},
		{"no relay", far(100), 4, 100, nil},
		{"shared evenly", append([]string{"self", "c1", "c2", "c3"}, far(30)...), 4, 4, []int{10, 10, 10}},
		{"at least relayMinBatch each", append([]string{"c1", "c2", "c3", "c4"}, far(6)...), 4, 4, []int{4, 2}},
		{"at most relayBatch each, the rest direct", append([]string{"c1", "c2"}, far(200)...), 4, 2 + 200 - 2*relayBatch, []int{relayBatch, relayBatch}},
	} {
		direct, groups := relayPlan(targets(c.targets...), id("self"), connected, c.from)
		var per []int
		seen := map[string]bool{}
		for _, g := range groups {
			per = append(per, len(g.targets))
			if !connected(g.via) {
				t.Errorf("%s: relay %s not connected", c.name, g.via)
			}
			for _, n := range names(g.targets) {
				seen[n] = true
			}
		}
		for _, n := range names(direct) {
			seen[n] = true
		}
		if len(direct) != c.direct || !slices.Equal(per, c.groups) || len(seen) != len(c.targets) {
			t.Errorf("%s: %d direct, groups %v, %d of %d targets planned; want %d direct, groups %v",
				c.name, len(direct), per, len(seen), len(c.targets), c.direct, c.groups)
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
	if n := a.callConnsClosed.Load(); n != 0 {
		t.Errorf("a opened and closed %d connections for the call", n)
	}
}
