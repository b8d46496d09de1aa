package node

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkNodesView measures `tribe nodes` (Node.Nodes) on a node that
// holds the records of 1,000 nodes, each with facts as large as this
// host's: the first call after the records arrived, which decodes each
// (cold: as every call did before records were kept decoded), against
// the calls after it (warm), side by side in one run. A poll of every
// agent's list, as the membership benchmark makes, cost each agent 2.2 ms
// of CPU at 50 nodes when every call decoded them all.
func BenchmarkNodesView(b *testing.B) {
	const fleet = 1000
	ctx := context.Background()
	n := startNode(b, loopbackConfig(b, "a"))
	facts := map[string]any(n.facts.get())
	for i := range fleet - 1 {
		id, _, s := madeUpRecord(b, map[string]any{"name": fmt.Sprintf("n%d", i), "version": Version,
			"addrs": []string{"/ip4/10.0.0.1/tcp/4001"}, "facts": facts}, time.Now())
		if _, err := n.replica.Accept(id, s.Raw); err != nil {
			b.Fatal(err)
		}
	}
	waitFor(b, "every record stored", func() bool { return len(n.replica.Prefix(nodesPrefix)) == fleet })
	var cold, warm time.Duration
	for b.Loop() {
		n.records.Clear()
		t0 := time.Now()
		nodes, err := n.Nodes(ctx, "")
		cold += time.Since(t0)
		if err != nil || len(nodes) != fleet {
			b.Fatalf("%d nodes listed (%v), want %d", len(nodes), err, fleet)
		}
		t0 = time.Now()
		if _, err := n.Nodes(ctx, ""); err != nil {
			b.Fatal(err)
		}
		warm += time.Since(t0)
	}
	b.ReportMetric(float64(cold.Microseconds())/float64(b.N), "cold_us")
	b.ReportMetric(float64(warm.Microseconds())/float64(b.N), "warm_us")
	b.ReportMetric(float64(cold)/float64(warm), "cold/warm")
}
