package sim

import (
	"context"
	"testing"
	"time"
)

func start(t *testing.T, cfg Config) *Sim {
	t.Helper()
	cfg.Dir = t.TempDir()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func rangeOf(lo, hi int) []int {
	var out []int
	for i := lo; i < hi; i++ {
		out = append(out, i)
	}
	return out
}

// Every node is told to join only one earlier node (a random tree), so
// reaching three peers each takes the DHT rendezvous working.
func TestHundredNodesFindPeersPartitionAndHeal(t *testing.T) {
	if testing.Short() {
		t.Skip("100-node simulation")
	}
	const n = 100
	ctx := context.Background()
	s := start(t, Config{Nodes: n, Seed: 1})
	// On progress, not a deadline: a busy machine slows the cluster
	// down without stopping it.
	took, err := s.WaitProgress(ctx, time.Minute, func() int { return s.NodesWithPeers(3) },
		func() bool { return s.MinPeers() >= 3 })
	if err != nil {
		t.Fatalf("not every node reached 3 peers: min %d: %v", s.MinPeers(), err)
	}
	t.Logf("every node has >= 3 peers after %v", took)

	a, b := rangeOf(0, n/2), rangeOf(n/2, n)
	if got := s.CrossConnections(a, b); got == 0 {
		t.Fatal("no connection across the halves before the partition; the test would prove nothing")
	}
	if err := s.Partition(a, b); err != nil {
		t.Fatal(err)
	}
	// The nodes keep redialling their seeds and remembered peers on the
	// other side (backoff 100ms to 2s in the sim): it must stay closed.
	if err := s.Holds(ctx, 5*time.Second, func() bool {
		return s.CrossConnections(a, b)+s.CrossConnections(b, a) == 0
	}); err != nil {
		t.Fatalf("connections across a partition: %v", err)
	}
	if c := s.Components(); c < 2 {
		t.Fatalf("partitioned cluster has %d component(s)", c)
	}

	if err := s.Heal(); err != nil {
		t.Fatal(err)
	}
	took, err = s.WaitProgress(ctx, time.Minute, func() int {
		return s.NodesWithPeers(3) + min(s.CrossConnections(a, b), n) - s.Components()
	}, func() bool {
		return s.Components() == 1 && s.CrossConnections(a, b) > 0 && s.MinPeers() >= 3
	})
	if err != nil {
		t.Fatalf("not healed: components %d, cross %d, min peers %d: %v", s.Components(), s.CrossConnections(a, b), s.MinPeers(), err)
	}
	t.Logf("healed after %v: %d connections across", took, s.CrossConnections(a, b))
}

func TestCrashAndRestartRejoinsFromRememberedPeers(t *testing.T) {
	ctx := context.Background()
	s := start(t, Config{Nodes: 10, Seed: 2})
	if _, err := s.WaitFor(ctx, time.Minute, func() bool { return s.MinPeers() >= 3 }); err != nil {
		t.Fatalf("min peers %d: %v", s.MinPeers(), err)
	}
	const victim = 0 // node 0 joins nobody: only remembered peers bring it back
	before := len(s.Peers(victim))
	if err := s.Crash(victim); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WaitFor(ctx, 30*time.Second, func() bool {
		return s.CrossConnections(rangeOf(1, 10), []int{victim}) == 0
	}); err != nil {
		t.Fatal("peers still connected to the crashed node")
	}
	if err := s.Restart(ctx, victim); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WaitFor(ctx, time.Minute, func() bool { return len(s.Peers(victim)) >= min(3, before) }); err != nil {
		t.Fatalf("restarted node has %d peers, had %d: %v", len(s.Peers(victim)), before, err)
	}
}

func TestPartitionRejectsBadGroups(t *testing.T) {
	s, err := New(Config{Nodes: 3, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, groups := range [][][]int{
		{{0, 1}},         // node 2 in no group
		{{0, 1}, {1, 2}}, // node 1 twice
		{{0, 1, 2, 3}},   // no node 3
	} {
		if err := s.Partition(groups...); err == nil {
			t.Errorf("Partition(%v) accepted", groups)
		}
	}
}
