package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/policy"
)

// BenchmarkPolicyVsBroadcast: the time from `policy create` on a random
// node until every matching node's membership is visible on every node
// (the policy goes out, each matching node evaluates it and writes its
// membership, the memberships come back), against one plain gossipsub
// broadcast of the same size from the same node on the same cluster,
// alternated in one run. Target: at most 3x. 300 nodes need TRIBE_BENCH_300=1 (several minutes to connect).
//
// It also times, on the same cluster, the floor the design sets: one plain
// broadcast followed by a wave of plain messages published at once by the
// matching nodes (wave_ms). policy/floor_ratio is the policy path against
// that floor, i.e. what signing, checking, storing and evaluating add. On
// a few shared cores the simulation is bound by CPU, not by link latency,
// so the wave alone costs several broadcasts. A wave can lose a message
// for good (plain gossipsub has no anti-entropy; seen at 300 nodes):
// waves_lost counts those rounds, and wave_ms is the mean of the others.
func BenchmarkPolicyVsBroadcast(b *testing.B) {
	sizes := []int{100}
	if os.Getenv("TRIBE_BENCH_300") != "" {
		sizes = append(sizes, 300)
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			r := policyVsBroadcast(b, n, MockNet)
			b.ReportMetric(ms(r.policy), "policy_ms")
			b.ReportMetric(ms(r.plain), "broadcast_ms")
			b.ReportMetric(ms(r.wave), "wave_ms")
			b.ReportMetric(float64(r.policy)/float64(r.plain), "policy/broadcast_ratio")
			b.ReportMetric(float64(r.policy)/float64(r.plain+r.wave), "policy/floor_ratio")
			b.ReportMetric(float64(r.waveLost), "waves_lost")
			for q, c := range r.dropped {
				b.ReportMetric(float64(c), "dropped_"+q)
			}
		})
	}
}

// policyTimes are mean times over the rounds of policyVsBroadcast.
type policyTimes struct {
	policy time.Duration // policy create until every membership is everywhere
	plain  time.Duration // one plain broadcast
	wave   time.Duration // a plain message from each matching node at once
	// waveLost counts the rounds whose wave never fully arrived (plain
	// gossipsub has no anti-entropy); wave is the mean of the others.
	waveLost int
	// dropped sums the copies pubsub dropped under load during the
	// policy phases, over all nodes, by queue.
	dropped map[string]int64
}

func policyVsBroadcast(b testing.TB, n int, net Network) policyTimes {
	ctx := context.Background()
	facts := randomFacts(9)
	s := quietCluster(b, Config{Nodes: n, Seed: 9, Facts: facts, Net: net}, true)
	defer s.Close()
	topics, arrivals := plainTopic(b, s, n)

	const rounds = 10 // one per rack: every node matches once
	var viaPolicy, plain, wave time.Duration
	waveLost := 0
	dropped := map[string]int64{}
	origins := rand.New(rand.NewPCG(9, 1))
	for r := range rounds {
		from := origins.IntN(n) // creates the policy, and sends the plain broadcast
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
		before := s.Dropped()
		start := time.Now()
		if _, err := s.Node(from).CreatePolicy(ctx, tribe, tribe, expr); err != nil {
			b.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(5 * time.Minute):
			mu.Lock()
			b.Fatalf("round %d: memberships did not reach every node: %s", r, missing(s, tribe, matching, seen))
		}
		viaPolicy += time.Since(start)
		for q, c := range s.Dropped() {
			dropped[q] += c - before[q]
		}
		plain += broadcastOnce(b, topics[from], arrivals, fmt.Sprintf("policy-%06d", r))
		if d, ok := broadcastWave(b, topics, arrivals, matching, fmt.Sprintf("wave-%d", r)); ok {
			wave += d
		} else {
			waveLost++
		}
	}
	if waveLost == rounds {
		b.Fatal("no wave of plain messages reached every node")
	}
	return policyTimes{viaPolicy / rounds, plain / rounds, wave / time.Duration(rounds-waveLost), waveLost, dropped}
}

// missing says where a policy round stalled: the nodes that never got the
// policy, the matching nodes that never wrote their membership, the nodes
// still short of memberships, and what pubsub dropped.
func missing(s *Sim, tribe string, matching, seen []int) string {
	var noPolicy, noOwn, short int
	for i := range s.Len() {
		if _, ok := s.Node(i).Replica().Get("policies/" + tribe); !ok {
			noPolicy++
		}
		if seen[i] < len(matching) {
			short++
		}
	}
	for _, i := range matching {
		if _, ok := s.Node(i).Replica().Get(fmt.Sprintf("tribes/%s/members/%s/policy", tribe, s.ID(i))); !ok {
			noOwn++
		}
	}
	return fmt.Sprintf("%d nodes lack the policy, %d of %d matching nodes lack their own membership, %d nodes lack some; dropped so far %v",
		noPolicy, noOwn, len(matching), short, s.Dropped())
}

// broadcastWave publishes one entry-sized message from each node of from,
// all at once, and returns the time until every node has all of them, or
// false if some never arrived within a minute.
func broadcastWave(b testing.TB, topics []*pubsub.Topic, arrivals chan string, from []int, prefix string) (time.Duration, bool) {
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
			b.Logf("%s: %d of %d plain messages did not reach every node", prefix, len(want), len(from))
			return 0, false
		}
	}
	return time.Since(start), true
}

func mustCompile(b testing.TB, expr string) *policy.Program {
	p, err := policy.Compile(expr)
	if err != nil {
		b.Fatal(err)
	}
	return p
}
