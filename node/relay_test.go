package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

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
		groups, left, _ := assign(targets(far(c.targets)...), relays(c.relays), 0, func(callTarget, peer.ID) bool { return false })
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

	// A target is not handed to a relay it met before: each met c0, so
	// c1 and c2 take them all, and the turn goes on from there.
	groups, left, next := assign(targets(far(8)...), relays(3), 0, func(_ callTarget, via peer.ID) bool { return via == id("c0") })
	var got []string
	for _, g := range groups {
		got = append(got, fmt.Sprintf("%s:%d", string(g.via), len(g.targets)))
	}
	if !slices.Equal(got, []string{"c1:4", "c2:4"}) || len(left) != 0 || next%3 != 0 {
		t.Errorf("with c0 met by all: groups %v, %d left, next %d", got, len(left), next)
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

// schedTargets are n far targets t0, t1, ... and k relays r0, r1, ...
func schedTargets(n, k int) ([]callTarget, []peer.ID) {
	var ts []callTarget
	for i := range n {
		ts = append(ts, callTarget{id: peer.ID(fmt.Sprintf("t%d", i)), name: fmt.Sprintf("t%d", i)})
	}
	var rs []peer.ID
	for i := range k {
		rs = append(rs, peer.ID(fmt.Sprintf("r%d", i)))
	}
	return ts, rs
}

// A target no relay reaches goes through every round, each time to
// another relay, the last round's in dial mode, then directly, once.
func TestScheduleRelaysHandsBackThroughEveryRound(t *testing.T) {
	far, relays := schedTargets(12, 6)
	var (
		mu     sync.Mutex
		seenBy = map[peer.ID][]string{} // target: "round/relay" it was handed to
		direct = map[peer.ID]int{}
	)
	scheduleRelays(context.Background(), far, relays, func(round int, via peer.ID, ts []callTarget, back func(callTarget)) {
		for _, tg := range ts {
			mu.Lock()
			seenBy[tg.id] = append(seenBy[tg.id], fmt.Sprintf("%d/%s", round, via))
			mu.Unlock()
			back(tg)
		}
	}, func(ts []callTarget) {
		mu.Lock()
		defer mu.Unlock()
		for _, tg := range ts {
			direct[tg.id]++
		}
	})
	for _, tg := range far {
		hops := seenBy[tg.id]
		if len(hops) != relayRounds || direct[tg.id] != 1 {
			t.Fatalf("%s: handed to %v, directly %d times; want %d rounds, then once directly", tg.id, hops, direct[tg.id], relayRounds)
		}
		vias := map[string]bool{}
		for r, h := range hops {
			round, via, _ := strings.Cut(h, "/")
			if round != fmt.Sprint(r) {
				t.Fatalf("%s: handed out in the order %v", tg.id, hops)
			}
			vias[via] = true
		}
		if len(vias) != relayRounds {
			t.Errorf("%s: handed to the same relay twice: %v", tg.id, hops)
		}
	}
}

// A target a relay hands back goes on to the next round at once, while
// other relays of its round still hold theirs: on a melted fleet one slow
// target used to hold every round behind it until the call's deadline.
func TestScheduleRelaysDoesNotWaitForASlowRelay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	far, relays := schedTargets(8, 2) // r0 and r1 take 4 each in round 0
	release := make(chan struct{})
	var (
		mu       sync.Mutex
		answered = map[peer.ID]int{}
	)
	scheduleRelays(ctx, far, relays, func(round int, via peer.ID, ts []callTarget, back func(callTarget)) {
		switch {
		case round == 0 && via == "r0":
			// Holds its targets until a target r1 handed back has
			// been answered in the next round.
			select {
			case <-release:
			case <-ctx.Done():
			}
		case round == 0:
			for _, tg := range ts {
				back(tg)
			}
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, tg := range ts {
			answered[tg.id]++
			if round == 1 && len(answered) == len(far)/2 {
				close(release)
			}
		}
	}, func(ts []callTarget) { t.Errorf("sent directly: %v", ts) })
	if ctx.Err() != nil {
		t.Fatal("the slow relay held the next round until the deadline")
	}
	if len(answered) != len(far) {
		t.Fatalf("answered %v", answered)
	}
}
