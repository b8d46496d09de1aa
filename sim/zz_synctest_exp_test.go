package sim

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

func TestExpSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s, err := New(Config{Nodes: 10, Seed: 1, Joins: 3, Latency: 10 * time.Millisecond, Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		d, err := s.WaitFor(ctx, time.Minute, func() bool { return s.MinPeers() >= 3 })
		t.Log("connected", d, err)
		start := time.Now()
		if _, err := s.Node(0).Replica().Put(ctx, "tribes/x", make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
		d, err = s.WaitFor(ctx, time.Minute, func() bool { return s.Converged() })
		t.Log("converged", d, err, time.Since(start))
		t.Log(s.Close())
	})
}
