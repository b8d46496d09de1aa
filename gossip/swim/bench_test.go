package swim

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

// BenchmarkDetectorPerNode: what failure detection costs one node as the
// fleet grows, in simulated time (one minute, 1% loss, one crash so there
// is something to spread): messages a node sends per second and the CPU
// the whole simulation takes per node-second, at 100, 1,000 and 5,000
// nodes. CPU is counted from 10 s in, when every node has made its
// first probe round (the one-off cost of learning N members). Target: the
// largest over 100 at most 1.2 (flat in N).
func BenchmarkDetectorPerNode(b *testing.B) {
	sizes := []int{100, 1000, 5000}
	msgs, cpu := map[int]float64{}, map[int]float64{}
	for range b.N {
		for _, n := range sizes {
			var sent int64
			var used time.Duration
			synctest.Test(&testing.T{}, func(t *testing.T) {
				c := newCluster(t, n, 0.01)
				time.Sleep(10 * time.Second)
				cpu0, sent0 := cpuTime(), c.net.sent.Load()
				c.crash(n / 2)
				time.Sleep(50 * time.Second)
				used, sent = cpuTime()-cpu0, c.net.sent.Load()-sent0
				c.stop()
			})
			msgs[n] += float64(sent) / float64(n) / 50
			cpu[n] += float64(used.Microseconds()) / float64(n) / 50
		}
	}
	for _, n := range sizes {
		b.ReportMetric(msgs[n]/float64(b.N), fmt.Sprintf("msgs/node/s@%d", n))
		b.ReportMetric(cpu[n]/float64(b.N), fmt.Sprintf("us/node/s@%d", n))
	}
	last := sizes[len(sizes)-1]
	b.ReportMetric(msgs[last]/msgs[100], fmt.Sprintf("msgs_%d/100", last))
	b.ReportMetric(cpu[last]/cpu[100], fmt.Sprintf("cpu_%d/100", last))
}

// cpuTime is the CPU the process has used: real, whatever synctest's
// clock says.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkProbeStep: the core's work for one probe period of one node
// (pick a target, draw indirect helpers and gossip targets, apply a
// message of updates, end expired suspicions, fill a message), at 100,
// 1,000 and 5,000 members: flat in N, since nothing in it walks the
// membership (a probe round's shuffle is spread over the round's probes).
func BenchmarkProbeStep(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			m := NewMembers(Config{Self: "self"}, rand.New(rand.NewPCG(1, 1)))
			for i := range n {
				m.Add(fmt.Sprintf("n%04d", i), t0)
			}
			now := t0
			msg := []Update{{Node: "n0001", State: Alive, From: "n0001"}}
			b.ResetTimer()
			for i := range b.N {
				now = now.Add(time.Second)
				target, _ := m.NextProbe()
				m.Random(3, false, target)
				m.Random(3, true)
				msg[0].Incarnation = uint64(i + 1)
				m.Apply(msg, now)
				m.Tick(now)
				m.Piggyback()
			}
		})
	}
}
