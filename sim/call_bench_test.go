package sim

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api"
)

// BenchmarkFanOutGrowth: on one simulated cluster of 100 nodes with 10 ms
// links, node 0 calls echo on every member of tribes of 5, 25 and 99
// members (nodes other than itself), and on one member alone, alternated
// in the same run. Reported: each fan-out's time until the last answer,
// and its ratio to the single call (target for 25: at most 5x).
func BenchmarkFanOutGrowth(b *testing.B) {
	const n = 100
	ctx := context.Background()
	s := quietCluster(b, Config{Nodes: n, Seed: 11}, false)
	defer s.Close()
	caller := s.Node(0)
	// Joining a node by peer ID needs its record: wait for all of them.
	if _, err := s.WaitFor(ctx, 5*time.Minute, func() bool {
		nodes, err := caller.Nodes(ctx, "")
		return err == nil && len(nodes) == n
	}); err != nil {
		b.Fatalf("node 0 does not know all %d nodes: %v", n, err)
	}
	sizes := []int{5, 25, n - 1}
	for _, k := range sizes {
		tribe := fmt.Sprintf("f%d", k)
		if _, err := caller.CreateTribe(ctx, tribe); err != nil {
			b.Fatal(err)
		}
		var ids []string
		for i := 1; i <= k; i++ {
			ids = append(ids, s.ID(i).String())
		}
		if _, err := caller.Join(ctx, tribe, ids); err != nil {
			b.Fatal(err)
		}
		if _, err := caller.LoadPlugin(ctx, "echo", tribe, api.LoadRequest{}); err != nil {
			b.Fatal(err)
		}
	}
	loaded := 0
	if _, err := s.WaitFor(ctx, 2*time.Minute, func() bool {
		ps, _ := caller.Plugins(ctx, "")
		loaded = 0
		for _, p := range ps {
			for _, pn := range p.Nodes {
				if pn.State == "loaded" {
					loaded++
				}
			}
		}
		return loaded == 5+25+n-1
	}); err != nil {
		b.Fatalf("echo loaded on %d of %d members, as node 0 sees it", loaded, 5+25+n-1)
	}
	call := func(req api.CallRequest) time.Duration {
		req.Plugin, req.Method, req.Args = "echo", "echo", []byte(`{"ping":1}`)
		start := time.Now()
		sum, err := caller.Call(ctx, req, func(api.CallResult) {})
		if err != nil {
			b.Fatal(err)
		}
		if sum.Answered != sum.Targets {
			b.Fatalf("%+v: not every member answered", sum)
		}
		return time.Since(start)
	}
	one := api.CallRequest{Nodes: []string{s.ID(1).String()}}
	for _, k := range sizes { // warm-up: every member connected once
		call(api.CallRequest{Tribes: []string{fmt.Sprintf("f%d", k)}})
	}
	const rounds = 10
	var single time.Duration
	fan := make([]time.Duration, len(sizes))
	b.ResetTimer()
	for range b.N {
		for range rounds {
			single += call(one)
			for j, k := range sizes {
				fan[j] += call(api.CallRequest{Tribes: []string{fmt.Sprintf("f%d", k)}})
			}
		}
	}
	b.ReportMetric(float64(single.Microseconds())/1000/float64(rounds*b.N), "one_ms")
	for j, k := range sizes {
		b.ReportMetric(float64(fan[j].Microseconds())/1000/float64(rounds*b.N), fmt.Sprintf("fan%d_ms", k))
		b.ReportMetric(float64(fan[j])/float64(single), fmt.Sprintf("fan%d/one", k))
	}
}
