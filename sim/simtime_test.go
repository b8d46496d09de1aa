package sim

import (
	"fmt"
	"os"
	"testing"
	"testing/synctest"
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
				t.Logf("nodes=%d  %.1f policy_ms  %.1f broadcast_ms  %.1f wave_ms  %.2f policy/broadcast_ratio  %.2f policy/floor_ratio (simulated time); dropped under load %v",
					n, ms(r.policy), ms(r.plain), ms(r.wave), float64(r.policy)/float64(r.plain), float64(r.policy)/float64(r.plain+r.wave), r.dropped)
			})
		})
	}
}
