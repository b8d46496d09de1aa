package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node"
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

// BenchmarkWriteVsBroadcast: the time for one state write on node 0 to be
// applied on every node, against the time for a plain gossipsub message of
// the same size to reach every node, on the same simulated cluster and
// alternated in the same run. Target: at most 1.5x. The write path adds
// signing, a signature check on every hop and a store on every node.
//
// 1,000 nodes run as a sparse cluster (Config.Sparse: only the join edges
// linked, no DHT): 1,000 full nodes (all-to-all mock links, a DHT each) in
// one process took over 15 minutes and 12 GB just to connect on a 2-core
// machine; sparse, about a minute and 1.4 GB. Both the write and the
// broadcast travel the same join graph, so the ratio compares like with
// like. TRIBE_BENCH_SMALL=1 leaves 1,000 out.
func BenchmarkWriteVsBroadcast(b *testing.B) {
	sizes := []int{100, 300, 1000}
	if os.Getenv("TRIBE_BENCH_SMALL") != "" {
		sizes = sizes[:2]
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			write, plain := writeVsBroadcast(b, n, MockNet)
			b.ReportMetric(ms(write), "write_ms")
			b.ReportMetric(ms(plain), "broadcast_ms")
			b.ReportMetric(float64(write)/float64(plain), "write/broadcast_ratio")
		})
	}
}

// writeVsBroadcast returns the mean time of a write and of a plain
// broadcast reaching every node of an n-node cluster, alternated over
// five rounds. Each round both start on the same node, picked at random:
// the first nodes are the join targets of many and reach most of the
// cluster in one hop, so starting always on node 0 would flatter both.
func writeVsBroadcast(b testing.TB, n int, net Network) (write, plain time.Duration) {
	ctx := context.Background()
	s := quietCluster(b, Config{Nodes: n, Seed: 7, Sparse: n >= 1000, Net: net}, false)
	defer s.Close()

	// The write's arrival on each node, by watcher.
	var mu sync.Mutex
	applied := map[string]int{}
	allApplied := make(chan string, 16)
	for i := range n {
		s.Node(i).Replica().Watch("tribes/bench-", func(c gossip.Change) {
			mu.Lock()
			applied[c.Key]++
			done := applied[c.Key] == n
			mu.Unlock()
			if done {
				allApplied <- c.Key
			}
		})
	}
	topics, arrivals := plainTopic(b, s, n)
	const rounds = 5
	origins := rand.New(rand.NewPCG(7, 1))
	for r := range rounds {
		from := origins.IntN(n)
		key := fmt.Sprintf("tribes/bench-%d", r)
		start := time.Now()
		if _, err := s.Node(from).Replica().Put(ctx, key, make([]byte, 100)); err != nil {
			b.Fatal(err)
		}
		waitID(b, allApplied, key)
		w := time.Since(start)
		p := broadcastOnce(b, topics[from], arrivals, fmt.Sprintf("plain-%010d", r))
		b.Logf("round %d from node %d: write %.1f ms, broadcast %.1f ms", r, from, ms(w), ms(p))
		write += w
		plain += p
	}
	return write / rounds, plain / rounds
}

// plainTopic joins a plain gossipsub topic on every node, counts the
// arrivals of each message (by its first 16 bytes) and waits for the mesh.
// The readers stop and the topics close when the test ends.
func plainTopic(b testing.TB, s *Sim, n int) ([]*pubsub.Topic, chan string) {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	arrived := map[string]int{}
	all := make(chan string, 16)
	topics := make([]*pubsub.Topic, n)
	b.Cleanup(func() {
		cancel()
		for _, t := range topics {
			if t != nil {
				t.Close()
			}
		}
	})
	for i := range n {
		t, err := s.Node(i).PubSub().Join("bench/plain")
		if err != nil {
			b.Fatal(err)
		}
		topics[i] = t
		sub, err := t.Subscribe()
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			for {
				m, err := sub.Next(ctx)
				if err != nil {
					return
				}
				id := string(m.Data[:16])
				mu.Lock()
				arrived[id]++
				done := arrived[id] == n
				mu.Unlock()
				if done {
					all <- id
				}
			}
		}()
	}
	if _, err := s.WaitFor(ctx, time.Minute, func() bool {
		for _, t := range topics {
			if len(t.ListPeers()) == 0 {
				return false
			}
		}
		return true
	}); err != nil {
		b.Fatal("plain topic mesh did not form")
	}
	time.Sleep(3 * time.Second) // a few 1 s heartbeats to fill the mesh to its degree
	return topics, all
}

// broadcastOnce publishes a message of about an entry's size (id is its
// first 16 bytes) and returns the time until every node has it.
func broadcastOnce(b testing.TB, t *pubsub.Topic, arrivals chan string, id string) time.Duration {
	id = fmt.Sprintf("%-16.16s", id)
	msg := append([]byte(id), make([]byte, 250)...)
	start := time.Now()
	if err := t.Publish(context.Background(), msg); err != nil {
		b.Fatal(err)
	}
	waitID(b, arrivals, id)
	return time.Since(start)
}

func waitID(b testing.TB, ch chan string, id string) {
	timeout := time.After(time.Minute)
	for {
		select {
		case got := <-ch:
			if got == id {
				return
			}
		case <-timeout:
			b.Fatalf("%s did not reach every node", id)
		}
	}
}

// quietCluster starts cfg's nodes on 10 ms links, each joining three
// earlier ones, with failure detection turned down (what is measured is
// state and calls, not probes) and, unless keepSync, periodic
// sync too, and waits until every node has three peers. With keepSync
// each node pulls at the simulator's interval (N×100 ms: 30 s at 300
// nodes, the agent's default), so what pubsub drops under load still
// arrives, as it would in a fleet.
func quietCluster(b testing.TB, cfg Config, keepSync bool) *Sim {
	cfg.Joins, cfg.Latency, cfg.Dir = 3, 10*time.Millisecond, b.TempDir()
	tune := cfg.Tune
	cfg.Tune = func(i int, c *node.Config) {
		c.ProbeInterval = time.Hour
		if !keepSync {
			c.SyncInterval = time.Hour
		}
		if tune != nil {
			tune(i, c)
		}
	}
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Start(ctx); err != nil {
		s.Close()
		b.Fatal(err)
	}
	if _, err := s.WaitFor(ctx, 10*time.Minute, func() bool { return s.MinPeers() >= 3 }); err != nil {
		s.Close()
		b.Fatalf("cluster did not connect: %v", err)
	}
	return s
}
