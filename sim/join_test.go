package sim

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tribeagent/tribe/gossip"
)

// A node that joins a fleet is known to every node before its own mesh
// forms: it writes its record before it has any peer and holds it until
// two gossipsub heartbeats after the first joins the topic (2 s), but the
// peers it syncs with on joining pass it on at once. Simulated time, no
// DHT: 30 nodes up, the 31st joins three of them: 0.12 s, and 1.16 s
// without the relay.
func TestNewcomerKnownBeforeItsMeshForms(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 30
		ctx := context.Background()
		s, err := New(Config{Nodes: n + 1, Seed: 41, Joins: 3, Latency: 10 * time.Millisecond, Net: SimNet, Sparse: true, Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		fleet := make([]int, n)
		for i := range fleet {
			fleet[i] = i
		}
		if err := s.StartNodes(ctx, fleet...); err != nil {
			t.Fatal(err)
		}
		if _, err := s.WaitFor(ctx, time.Minute, func() bool {
			for _, i := range fleet {
				if len(s.Node(i).Replica().Prefix("nodes/")) != n {
					return false
				}
			}
			return true
		}); err != nil {
			t.Fatalf("the fleet did not agree on its members: %v", err)
		}
		var mu sync.Mutex
		holders := 0
		all := make(chan struct{})
		for _, i := range fleet {
			s.Node(i).Replica().Watch("nodes/"+s.ID(n).String(), func(c gossip.Change) {
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
			t.Fatalf("after a minute %d of %d nodes hold the newcomer's record", holders, n)
		}
		took := time.Since(start)
		relayed := int64(0)
		for _, i := range fleet {
			relayed += s.Node(i).Replica().SyncTotals().Relayed
		}
		t.Logf("every node held the newcomer's record %v after it started (simulated); %d entries relayed", took, relayed)
		if took >= time.Second {
			t.Fatalf("the fleet learnt of the newcomer only after %v: nobody passed its record on", took)
		}
	})
}
