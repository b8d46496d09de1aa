package sim

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tribeagent/tribe/node"
)

// Simulated nodes are built with a real agent's connection manager (and,
// on SimNet, its resource manager): with water marks far below the
// fleet, node 0 still calls echo on every member of a tribe of all 40,
// and two simulated minutes later (past the manager's one-minute grace)
// no node holds more than ConnHigh connections besides the protected ones
// (the DHT protects its two nearest-to-empty buckets, up to 40 peers;
// gossipsub its mesh; the node its --join peers), as a real agent would
// not. On hosts without the manager a node held 37.
func TestSimHostsKeepAnAgentsConnectionLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, low, high = 40, 4, 10
		ctx := context.Background()
		s, err := New(Config{Nodes: n, Seed: 21, Joins: 2, Latency: 5 * time.Millisecond, Net: SimNet, Dir: t.TempDir(),
			Tune: func(_ int, c *node.Config) {
				c.ConnLow, c.ConnHigh, c.TargetPeers = low, high, low
				c.ProbeInterval = 5 * time.Second
			}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := s.WaitFor(ctx, time.Minute, func() bool { return s.MinPeers() >= 2 }); err != nil {
			t.Fatalf("nodes did not connect: %v", err)
		}
		echoToAll(t, s, 2*time.Minute)
		callAll(t, s)

		time.Sleep(2 * time.Minute) // simulated: the grace period ends, the managers trim
		most, at, all := 0, 0, 0
		for i := range n {
			h := s.Node(i).Host()
			free := 0
			for _, p := range h.Network().Peers() {
				if !h.ConnManager().IsProtected(p, "") {
					free++
				}
			}
			if free > most {
				most, at, all = free, i, len(h.Network().Peers())
			}
		}
		if most > high {
			t.Fatalf("node %d holds %d unprotected connections (%d in all), over ConnHigh %d: the connection manager did not trim", at, most, all, high)
		}
		t.Logf("most unprotected connections held by one node: %d of %d (ConnHigh %d)", most, all, high)
	})
}
