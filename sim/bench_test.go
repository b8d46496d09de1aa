package sim

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkSimHeapPerNode starts N simulated nodes, each told to join one
// random earlier node, waits until every node has 3 peers, and reports the
// live heap per node (without the mock network's N² links, reported apart)
// and the time to connect.
func BenchmarkSimHeapPerNode(b *testing.B) {
	for _, n := range []int{100, 500} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				r, err := RunScenario(context.Background(), "connect", Config{Nodes: n, Seed: uint64(i + 1), Dir: b.TempDir()}, 3, 10*time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(r.HeapPerNodeBytes)/1024, "heap_KiB/node")
				b.ReportMetric(float64(r.MocknetHeapBytes)/(1<<20), "mocknet_MiB")
				b.ReportMetric(r.ConnectMS, "connect_ms")
			}
		})
	}
}
