package sim

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tribeagent/tribe/node"
	"github.com/tribeagent/tribe/node/api"
)

// A join storm, in simulated time: 40 nodes boot at once, every one told
// to --join node 0 alone, with water marks far below the fleet (ConnHigh
// 8) and no DHT, so the seed is all a joiner knows. Once it holds ConnHigh
// peers the seed sends seeking joiners on to its peers; every node still
// reaches its 4 peers, every joiner holds the seed busy (it comes back only
// when short of peers), and four minutes later (past the connection
// manager's grace and two trims) the seed holds about ConnHigh peers
// besides its gossipsub mesh. Without the sending on it held the whole
// fleet: each joiner protects its seed and dials it again whenever the
// seed's connection manager trims it.
func TestJoinStormIsShedBySeed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, high, target = 40, 8, 4
		ctx := context.Background()
		s, err := New(Config{Nodes: n, Seed: 31, Seeds: 1, Latency: 5 * time.Millisecond, Net: SimNet, Dir: t.TempDir(),
			Tune: func(_ int, c *node.Config) {
				c.ConnLow, c.ConnHigh, c.TargetPeers = target, high, target
				c.DHT = false
				c.ProbeInterval = 10 * time.Second // few probe connections
			}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		took, err := s.WaitFor(ctx, time.Minute, func() bool { return s.MinPeers() >= target })
		if err != nil {
			t.Fatalf("not every node reached %d peers: min %d: %v", target, s.MinPeers(), err)
		}
		time.Sleep(4 * time.Minute)
		st, err := s.Node(0).Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		busy := 0
		for i := 1; i < n; i++ {
			st, err := s.Node(i).Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, j := range st.Joins {
				if j.State == api.JoinBusy {
					busy++
				}
			}
		}
		held := len(s.Peers(0))
		h := s.Node(0).Host()
		free := 0
		for _, p := range h.Network().Peers() {
			if !h.ConnManager().IsProtected(p, "") {
				free++
			}
		}
		t.Logf("every node had %d peers after %v; the seed sent %d seekers on, and four minutes later holds %d peers (%d unprotected: gossipsub protects its mesh); %d joiners hold it busy",
			target, took, st.Rejected["conns_shed"], held, free, busy)
		if st.Rejected["conns_shed"] == 0 || busy == 0 {
			t.Fatalf("the seed sent %d seekers on, %d joiners were told busy: the storm was not shed", st.Rejected["conns_shed"], busy)
		}
		if free > 2*high {
			t.Fatalf("the seed holds %d unprotected peers (%d in all) four minutes after the storm; ConnHigh is %d", free, held, high)
		}
	})
}
