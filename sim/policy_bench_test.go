package sim

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/policy"
)

// BenchmarkPolicyVsBroadcast: the time from `policy create` on node 0 until
// every matching node's membership is visible on every node (the policy
// goes out, each matching node evaluates it and writes its membership, the
// memberships come back), against one plain gossipsub broadcast of the
// same size on the same cluster, alternated in one run. Target: at most
// 3x. 300 nodes need TRIBE_BENCH_300=1 (several minutes to connect).
//
// It also times, on the same cluster, the floor the design sets: one plain
// broadcast followed by a wave of plain messages published at once by the
// matching nodes (wave_ms). policy/floor_ratio is the policy path against
// that floor, i.e. what signing, checking, storing and evaluating add. On
// a few shared cores the simulation is bound by CPU, not by link latency,
// so the wave alone costs several broadcasts.
func BenchmarkPolicyVsBroadcast(b *testing.B) {
	sizes := []int{100}
	if os.Getenv("TRIBE_BENCH_300") != "" {
		sizes = append(sizes, 300)
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) { benchPolicyVsBroadcast(b, n) })
	}
}

func benchPolicyVsBroadcast(b *testing.B, n int) {
	ctx := context.Background()
	facts := randomFacts(9)
	s := quietCluster(b, Config{Nodes: n, Seed: 9, Facts: facts})
	defer s.Close()
	topics, arrivals := plainTopic(b, s, n)
	defer func() {
		for _, t := range topics {
			t.Close()
		}
	}()

	const rounds = 10 // one per rack: every node matches once
	var viaPolicy, plain, wave time.Duration
	for r := range rounds {
		tribe := fmt.Sprintf("bench-%d", r)
		expr := fmt.Sprintf(`facts.rack == %d`, r)
		var matching []int
		for i := range n {
			if ok, _ := mustCompile(b, expr).Eval(facts(i)); ok {
				matching = append(matching, i)
			}
		}
		// Count, per node, the policy memberships of this tribe it holds.
		var mu sync.Mutex
		seen := make([]int, n)
		complete := 0
		done := make(chan struct{})
		prefix := "tribes/" + tribe + "/members/"
		for i := range n {
			cancel := s.Node(i).Replica().Watch(prefix, func(c gossip.Change) {
				if !strings.HasSuffix(c.Key, "/policy") || c.Old != nil {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				seen[i]++
				if seen[i] == len(matching) {
					complete++
					if complete == n {
						close(done)
					}
				}
			})
			defer cancel()
		}
		start := time.Now()
		if _, err := s.Node(0).CreatePolicy(ctx, tribe, tribe, expr); err != nil {
			b.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(5 * time.Minute):
			b.Fatalf("round %d: memberships did not reach every node", r)
		}
		viaPolicy += time.Since(start)
		plain += broadcastOnce(b, topics[0], arrivals, fmt.Sprintf("policy-%06d", r))
		wave += broadcastWave(b, topics, arrivals, matching, fmt.Sprintf("wave-%d", r))
	}
	b.ReportMetric(float64(viaPolicy.Milliseconds())/rounds, "policy_ms")
	b.ReportMetric(float64(plain.Milliseconds())/rounds, "broadcast_ms")
	b.ReportMetric(float64(wave.Milliseconds())/rounds, "wave_ms")
	b.ReportMetric(float64(viaPolicy)/float64(plain), "policy/broadcast_ratio")
	b.ReportMetric(float64(viaPolicy)/float64(plain+wave), "policy/floor_ratio")
}

// broadcastWave publishes one entry-sized message from each node of from,
// all at once, and returns the time until every node has all of them.
func broadcastWave(b *testing.B, topics []*pubsub.Topic, arrivals chan string, from []int, prefix string) time.Duration {
	want := map[string]bool{}
	msgs := make([][]byte, len(from))
	for j := range from {
		id := fmt.Sprintf("%-16.16s", fmt.Sprintf("%s-%d", prefix, j))
		want[id] = true
		msgs[j] = append([]byte(id), make([]byte, 250)...)
	}
	start := time.Now()
	for j, i := range from {
		go topics[i].Publish(context.Background(), msgs[j])
	}
	timeout := time.After(time.Minute)
	for len(want) > 0 {
		select {
		case id := <-arrivals:
			delete(want, id)
		case <-timeout:
			b.Fatalf("%s: %d messages did not reach every node", prefix, len(want))
		}
	}
	return time.Since(start)
}

func mustCompile(b *testing.B, expr string) *policy.Program {
	p, err := policy.Compile(expr)
	if err != nil {
		b.Fatal(err)
	}
	return p
}
