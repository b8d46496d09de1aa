package sim

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node/api"
)

// echoToAll has node 0 put every node in tribe "all" with echo loaded,
// once it holds every node's record, and waits until every member says
// echo is loaded (limit: how long each wait may take).
func echoToAll(t testing.TB, s *Sim, limit time.Duration) {
	t.Helper()
	ctx, n, caller := context.Background(), s.Len(), s.Node(0)
	if _, err := s.WaitFor(ctx, limit, func() bool { return len(caller.Replica().Prefix("nodes/")) == n }); err != nil {
		t.Fatalf("node 0 holds %d of %d node records", len(caller.Replica().Prefix("nodes/")), n)
	}
	t.Logf("node 0 holds all %d node records", n)
	if _, err := caller.CreateTribe(ctx, "all"); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i := range n {
		ids[i] = s.ID(i).String()
	}
	if _, err := caller.Join(ctx, "all", ids); err != nil {
		t.Fatal(err)
	}
	if _, err := caller.LoadPlugin(ctx, "echo", "all", api.LoadRequest{}); err != nil {
		t.Fatal(err)
	}
	loaded := func() int {
		ps, _ := caller.Plugins(ctx, "all")
		got := 0
		for _, p := range ps {
			for _, pn := range p.Nodes {
				if pn.State == "loaded" {
					got++
				}
			}
		}
		return got
	}
	if _, err := s.WaitFor(ctx, limit, func() bool { return loaded() == n }); err != nil {
		t.Fatalf("echo loaded on %d of %d members", loaded(), n)
	}
	t.Logf("echo loaded on all %d members", n)
}

// callAll has node 0 call echo on tribe "all" (see echoToAll) and fails
// unless every member answers; it returns the time to the last answer.
func callAll(t testing.TB, s *Sim) time.Duration {
	t.Helper()
	start := time.Now()
	sum, err := s.Node(0).Call(context.Background(), api.CallRequest{Tribes: []string{"all"}, Plugin: "echo", Method: "echo", Args: []byte(`{"ping":1}`)}, func(api.CallResult) {})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Answered != s.Len() {
		t.Fatalf("%+v: %d of %d members answered", sum, sum.Answered, s.Len())
	}
	return took
}

// joinLate starts the fleet (every node but the last), waits until each of
// its nodes holds all of their records and its meshes have formed (3 s
// more: two gossipsub heartbeats, after which a node passes on a
// newcomer's record it pulled, gossip's unsentDelay), then starts the
// last node and returns how long until every node of the fleet holds the
// newcomer's record too (failing after a minute). Waiting on the records
// alone made the newcomer meet a fleet 1.3 s old once joining nodes
// pulled every 200 ms: one that does not relay yet.
func joinLate(t testing.TB, s *Sim, settle time.Duration) time.Duration {
	t.Helper()
	ctx, n := context.Background(), s.Len()-1
	fleet := make([]int, n)
	for i := range fleet {
		fleet[i] = i
	}
	if err := s.StartNodes(ctx, fleet...); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WaitFor(ctx, settle, func() bool {
		for _, i := range fleet {
			if len(s.Node(i).Replica().Prefix("nodes/")) != n {
				return false
			}
		}
		return true
	}); err != nil {
		t.Fatalf("the fleet of %d did not agree on its members: %v", n, err)
	}
	time.Sleep(3 * time.Second)
	var mu sync.Mutex
	holders := 0
	all := make(chan struct{})
	for _, i := range fleet {
		s.Node(i).Replica().Watch("nodes/"+s.ID(n).String(), func(c gossip.Change) {
			if c.Old != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if holders++; holders == n {
				close(all)
			}
		})
	}
	start := time.Now()
	if err := s.StartNodes(ctx, n); err != nil {
		t.Fatal(err)
	}
	select {
	case <-all:
	case <-time.After(time.Minute):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("after a minute %d of %d nodes hold the newcomer's record", holders, n)
	}
	return time.Since(start)
}
