package sim

import (
	"context"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node"
	"github.com/tribeagent/tribe/node/api/events"
)

// SWIM's indirect probes: with the link between node 0 and another cut
// (neither can dial the other, as behind a firewall between two hosts),
// node 0's direct probes of it fail, but the helpers it asks reach it, so
// node 0 never suspects it; once it crashes, node 0 does.
func TestIndirectProbesKeepACutNodeAlive(t *testing.T) {
	ctx := context.Background()
	const n, far = 6, 5
	// Each of the 5 others is probed once in 5 probe intervals: 30 s is
	// three probes of the cut node, each failing directly.
	const interval, watch = 2 * time.Second, 30 * time.Second
	s := start(t, Config{Nodes: n, Seed: 4, Joins: 1,
		Tune: func(_ int, c *node.Config) { c.ProbeInterval = interval }})
	liveness := func(of int) string {
		nodes, err := s.Node(0).Nodes(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, nd := range nodes {
			if nd.ID == s.ID(of).String() {
				return nd.Liveness
			}
		}
		return ""
	}
	if _, err := s.WaitFor(ctx, time.Minute, func() bool {
		for i := 1; i < n; i++ {
			if liveness(i) != node.Alive {
				return false
			}
		}
		return true
	}); err != nil {
		t.Fatalf("node 0 does not see every node alive: %v", err)
	}

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	got := make(chan events.Event, 256)
	ready := make(chan struct{})
	go s.Node(0).Watch(wctx, "nodes/"+s.ID(far).String(), func(e *events.Event) {
		if e == nil {
			close(ready)
			return
		}
		got <- *e
	})
	<-ready
	if err := s.Cut(0, far); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(watch)
	for done := false; !done; {
		select {
		case e := <-got:
			t.Fatalf("node 0 took the cut node for %s: %+v", e.State, e)
		case <-timeout:
			done = true
		}
	}
	if c := len(s.Mocknet().Net(s.ID(0)).ConnsToPeer(s.ID(far))); c != 0 {
		t.Fatalf("node 0 holds %d connections to the cut node: the cut did not hold", c)
	}

	if err := s.Crash(far); err != nil {
		t.Fatal(err)
	}
	// What is checked is the state the crash leads to (suspect first),
	// not how soon: far is probed once per round of 5 intervals, and a
	// make test that shares the 2 cores has taken over a minute to get
	// there (the detection time is measured in simulated time, by
	// TestCrashedNodeDeadEverywhere in gossip/swim).
	select {
	case e := <-got:
		if e.State != node.Suspect {
			t.Fatalf("the crashed node went %s on node 0, want suspect first", e.State)
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("crashed node %d still %s on node 0 after 3 minutes", far, liveness(far))
	}
}
