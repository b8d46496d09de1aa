package sim

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/p2p/protocol/ping"

	"github.com/tribeagent/tribe/node"
)

// Simulated time. The wall-clock benchmarks (BenchmarkWriteVsBroadcast,
// BenchmarkPolicyVsBroadcast) run hundreds of nodes in one process on a
// few cores, where every node's signature checks, stores and pubsub
// bookkeeping queue for the same CPU: they measure the machine's aggregate
// CPU as much as the protocol. A real fleet gives each host its own CPU.
// Inside a testing/synctest bubble the clock moves only when every
// goroutine is blocked, so CPU work takes no time and what remains is the
// protocol's own latency: link delays, hops, round trips, timers and
// queues. The CPU side is measured apart (gossip's BenchmarkMerge against
// raw ed25519 verifies, policy's BenchmarkEvalVsBareCEL).
//
// These are measurements, not assertions: make bench runs them with
// TRIBE_SIMTIME=1 and -v, and they log the same metrics as the benchmarks.
// synctest has no form for benchmarks, hence tests.

func simTimeOnly(t *testing.T) {
	if os.Getenv("TRIBE_SIMTIME") == "" {
		t.Skip("a measurement: set TRIBE_SIMTIME=1 (make bench does)")
	}
}

func TestSimTimeWriteVsBroadcast(t *testing.T) {
	simTimeOnly(t)
	for _, n := range []int{100, 300, 1000} {
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				write, plain := writeVsBroadcast(t, n, SimNet)
				t.Logf("nodes=%d  %.1f write_ms  %.1f broadcast_ms  %.2f write/broadcast_ratio (simulated time)",
					n, ms(write), ms(plain), float64(write)/float64(plain))
			})
		})
	}
}

func TestSimTimePolicyVsBroadcast(t *testing.T) {
	simTimeOnly(t)
	for _, n := range []int{100, 300} {
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := policyVsBroadcast(t, n, SimNet)
				t.Logf("nodes=%d  %.1f policy_ms  %.1f broadcast_ms  %.1f wave_ms  %.2f policy/broadcast_ratio  %.2f policy/floor_ratio (simulated time); waves lost %d; dropped under load %v",
					n, ms(r.policy), ms(r.plain), ms(r.wave), float64(r.policy)/float64(r.plain), float64(r.policy)/float64(r.plain+r.wave), r.waveLost, r.dropped)
			})
		})
	}
}

// SimNet under synctest, small enough for make test: the nodes connect
// over simulated QUIC, a write reaches every node, the clock is the
// bubble's (a 10 ms link shows as exactly that), and the faults that need
// mock links say so.
func TestSimNetInSimulatedTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s, err := New(Config{Nodes: 12, Seed: 3, Joins: 2, Latency: 10 * time.Millisecond, Net: SimNet, Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := s.WaitFor(ctx, time.Minute, func() bool { return s.MinPeers() >= 2 }); err != nil {
			t.Fatalf("simnet nodes did not connect: %v", err)
		}
		pctx, cancel := context.WithCancel(ctx)
		res := <-ping.Ping(pctx, s.Node(5).Host(), s.Peers(5)[0])
		cancel()
		if res.Error != nil || res.RTT != 20*time.Millisecond {
			t.Fatalf("ping over a 10 ms link: %v, %v; want a 20 ms round trip in simulated time", res.RTT, res.Error)
		}
		if _, err := s.Node(7).CreateTribe(ctx, "web"); err != nil {
			t.Fatal(err)
		}
		everywhere := func() bool {
			for i := range s.Len() {
				if _, ok := s.Node(i).Replica().Get("tribes/web"); !ok {
					return false
				}
			}
			return s.Converged()
		}
		if _, err := s.WaitFor(ctx, time.Minute, everywhere); err != nil {
			t.Fatalf("the tribe did not reach every node: %v", err)
		}
		if err := s.Partition([]int{0}, []int{1}); !errors.Is(err, errNeedMockNet) {
			t.Fatalf("Partition on SimNet: %v, want errNeedMockNet", err)
		}
		if err := s.Crash(1); !errors.Is(err, errNeedMockNet) {
			t.Fatalf("Crash on SimNet: %v, want errNeedMockNet", err)
		}
	})
}

// TestSimTimeMembership: a fleet of n nodes is up and agrees; one more
// node starts and --joins three of them, as any node does. Measured, in
// simulated time: from its start until every node of the fleet holds its
// record (a node whose record arrived is alive until a probe says
// otherwise), and that a sample of nodes lists it alive then. Issue 14's
// target: 1,000 nodes in at most 2 s, 5,000 in at most 3 s
// (-sim.members for other sizes).
func TestSimTimeMembership(t *testing.T) {
	simTimeOnly(t)
	for _, n := range membershipSizes() {
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				took := membershipJoin(t, n)
				t.Logf("nodes=%d  %.1f join_seen_by_all_ms (simulated time)", n, ms(took))
			})
		})
	}
}

var simMembers = flag.String("sim.members", "100,1000", "fleet sizes of TestSimTimeMembership, comma-separated")

func membershipSizes() []int { return fleetSizes(*simMembers) }

// fleetSizes parses a comma-separated list of fleet sizes.
func fleetSizes(list string) []int {
	var out []int
	for _, f := range strings.Split(list, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 1 {
			out = append(out, n)
		}
	}
	return out
}

func membershipJoin(t *testing.T, n int) time.Duration {
	// DHT off at 1,000 and more (as the other large simulations): n DHTs
	// do not fit one process; the newcomer's --join peers are its way in.
	s, err := New(Config{Nodes: n + 1, Seed: 17, Joins: 3, Latency: 10 * time.Millisecond, Net: SimNet,
		Sparse: n >= 1000, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	took := joinLate(t, s, 10*time.Minute)
	for i := range min(n, 20) {
		nodes, err := s.Node(i).Nodes(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		alive := false
		for _, nd := range nodes {
			alive = alive || (nd.ID == s.ID(n).String() && nd.Liveness == "alive")
		}
		if !alive {
			t.Fatalf("node %d holds the newcomer's record but does not list it alive", i)
		}
	}
	return took
}

// TestSimTimeFanOut: node 0 calls echo on every member of a tribe of all n
// nodes (-sim.fanout), over SimNet hosts built with a real agent's
// resource and connection managers, in simulated time. Every member must
// answer; measured: the time until the last answer, and the connections
// node 0 holds after (a call closes what it opened past ConnLow).
func TestSimTimeFanOut(t *testing.T) {
	simTimeOnly(t)
	for _, n := range fanOutSizes() {
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				took, held := fanOutAll(t, n)
				t.Logf("nodes=%d  %.1f fanout_all_ms  %d conns_after (ConnHigh %d; simulated time)", n, ms(took), held, node.DefaultConfig().ConnHigh)
			})
		})
	}
}

var simFanOut = flag.String("sim.fanout", "1000", "fleet sizes of TestSimTimeFanOut, comma-separated")

func fanOutSizes() []int { return fleetSizes(*simFanOut) }

func fanOutAll(t *testing.T, n int) (time.Duration, int) {
	s := quietCluster(t, Config{Nodes: n, Seed: 23, Sparse: n >= 1000, Net: SimNet}, false)
	defer s.Close()
	echoToAll(t, s, 10*time.Minute)
	took := callAll(t, s)
	return took, len(s.Node(0).Host().Network().Peers())
}
