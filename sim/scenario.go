package sim

import (
	"context"
	"fmt"
	"runtime"
	"time"
)

// Scenarios that RunScenario knows, for `tribe sim --scenario`.
var Scenarios = []string{"connect", "partition"}

// Report is what a scenario measured.
type Report struct {
	Scenario string `json:"scenario"`
	Nodes    int    `json:"nodes"`
	Seed     uint64 `json:"seed"`
	Latency  string `json:"latency"`
	// NodesUp is how many nodes started.
	NodesUp int `json:"nodes_up"`
	// MinPeers is the k of "every node has at least k peers".
	MinPeers int `json:"min_peers"`
	// ConnectMS is the time from start until every node had MinPeers.
	ConnectMS float64 `json:"connect_ms"`
	// HeapPerNodeBytes is the live heap of the running nodes divided by
	// their number, excluding the mock network's own links.
	HeapPerNodeBytes uint64 `json:"heap_per_node_bytes"`
	// MocknetHeapBytes is the mock network's heap (N² links), for scale.
	MocknetHeapBytes uint64 `json:"mocknet_heap_bytes"`
	// HealMS is, for "partition", the time from healing a two-way split
	// until the cluster was one component again with MinPeers everywhere.
	HealMS float64 `json:"heal_ms,omitempty"`
}

// RunScenario builds a cluster from cfg, runs the named scenario on it and
// reports what it measured. minPeers is the k every node must reach.
func RunScenario(ctx context.Context, name string, cfg Config, minPeers int, timeout time.Duration) (Report, error) {
	switch name {
	case "connect", "partition":
	default:
		return Report{}, fmt.Errorf("sim: unknown scenario %q (known: %v)", name, Scenarios)
	}
	r := Report{Scenario: name, Nodes: cfg.Nodes, Seed: cfg.Seed, Latency: cfg.Latency.String(), MinPeers: minPeers}
	base := liveHeap()
	s, err := New(cfg)
	if err != nil {
		return r, err
	}
	defer s.Close()
	withNet := liveHeap()
	r.MocknetHeapBytes = sub(withNet, base)

	start := time.Now()
	if err := s.Start(ctx); err != nil {
		return r, err
	}
	for i := range s.Len() {
		if s.Node(i) != nil {
			r.NodesUp++
		}
	}
	if _, err := s.WaitFor(ctx, timeout, func() bool { return s.MinPeers() >= minPeers }); err != nil {
		return r, fmt.Errorf("sim: not every node reached %d peers (min %d): %w", minPeers, s.MinPeers(), err)
	}
	r.ConnectMS = ms(time.Since(start))
	r.HeapPerNodeBytes = sub(liveHeap(), withNet) / uint64(cfg.Nodes)

	if name == "partition" {
		a, b := make([]int, 0, s.Len()/2), make([]int, 0, s.Len()-s.Len()/2)
		for i := range s.Len() {
			if i < s.Len()/2 {
				a = append(a, i)
			} else {
				b = append(b, i)
			}
		}
		if err := s.Partition(a, b); err != nil {
			return r, err
		}
		if got := s.CrossConnections(a, b); got != 0 {
			return r, fmt.Errorf("sim: %d connections across the partition", got)
		}
		if err := s.Heal(); err != nil {
			return r, err
		}
		took, err := s.WaitFor(ctx, timeout, func() bool { return s.Components() == 1 && s.MinPeers() >= minPeers })
		if err != nil {
			return r, fmt.Errorf("sim: cluster did not heal: %w", err)
		}
		r.HealMS = ms(took)
	}
	return r, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// liveHeap is the heap in use after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
