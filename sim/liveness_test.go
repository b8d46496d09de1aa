package sim

import (
	"context"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node"
)

// Liveness reaches past direct links: in a sparse cluster (each node
// linked only to the one it joined) node 0 sees every node alive,
// including the ones it cannot dial (indirect probes go through the
// linked ones), and a crashed one turns suspect there.
func TestLivenessReachesNodesWithoutAConnection(t *testing.T) {
	ctx := context.Background()
	const n = 8
	s := start(t, Config{Nodes: n, Seed: 4, Joins: 1, Sparse: true,
		Tune: func(_ int, c *node.Config) { c.ProbeInterval = time.Second }})
	if _, err := s.WaitFor(ctx, time.Minute, func() bool { return s.Components() == 1 }); err != nil {
		t.Fatal(err)
	}
	neighbours := map[string]bool{}
	for _, p := range s.Peers(0) {
		neighbours[p.String()] = true
	}
	if len(neighbours) >= n-1 {
		t.Fatalf("node 0 is linked to all %d others; the test needs some it is not", len(neighbours))
	}
	liveness := func() map[string]string {
		nodes, err := s.Node(0).Nodes(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, nd := range nodes {
			out[nd.ID] = nd.Liveness
		}
		return out
	}
	took, err := s.WaitFor(ctx, time.Minute, func() bool {
		l := liveness()
		for i := range n {
			if l[s.ID(i).String()] != node.Alive {
				return false
			}
		}
		return true
	})
	t.Logf("all alive after %v", took)
	if err != nil {
		t.Fatalf("node 0 does not see every node alive: %v (neighbours %d)", liveness(), len(neighbours))
	}

	// A node that node 0 is not linked to.
	far := -1
	for i := 1; i < n; i++ {
		if !neighbours[s.ID(i).String()] {
			far = i
		}
	}
	if err := s.Crash(far); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WaitFor(ctx, time.Minute, func() bool { return liveness()[s.ID(far).String()] == node.Suspect }); err != nil {
		t.Fatalf("crashed node %d still alive on node 0: %v", far, liveness())
	}
}
