package node

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins/jobs"
)

// BenchmarkJobWaitPerAck: what each ack of a job costs its writer while
// `job wait` follows the job there, at 100 targets and at 5,000 (the most a
// job takes), in one run. The acks are signed beforehand by as many
// identities and taken one at a time as a target hands its ack back
// (Accept: the signature check, the store), each once the one before it
// was streamed to the waiter, so that the wait wakes once per ack as it
// does when targets finish apart. Reported: the process's CPU per ack
// at each size (signature checks and stores included), and their ratio
// (target: flat in the job's size).
func BenchmarkJobWaitPerAck(b *testing.B) {
	w := startNode(b, loopbackConfig(b, "w"))
	sizes := []int{100, jobs.MaxTargets}
	type fleet struct {
		keys []crypto.PrivKey
		ids  []string
	}
	fleets := map[int]fleet{}
	for _, n := range sizes {
		var f fleet
		f.keys, f.ids = identities(b, n)
		fleets[n] = f
	}
	// one job to the fleet of size n, written by w, and its acks, signed
	// by their targets: done, as a target's final ack says.
	job := func(n int) (string, [][]byte) {
		f := fleets[n]
		id := writeJobTo(b, w, f.ids, time.Hour)
		now := w.now().UTC()
		acks := make([][]byte, n)
		for i, k := range f.keys {
			acks[i] = signAck(b, k, id, jobs.Ack{State: jobs.Done, Attempts: 1, OK: true, Started: now, Ended: now.Add(time.Millisecond)})
		}
		return id, acks
	}
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	// run takes every ack of a fresh job to n targets while a wait follows
	// it, and returns the CPU it cost.
	run := func(n int) time.Duration {
		id, acks := job(n)
		f := fleets[n]
		var streamed atomic.Int64
		waited := make(chan error, 1)
		rows := make(chan struct{}, 1)
		go func() {
			waited <- w.WaitJob(context.Background(), id, func(t *api.JobTarget) {
				if t != nil {
					streamed.Add(1)
					select {
					case rows <- struct{}{}:
					default:
					}
				}
			})
		}()
		start := cpu()
		for i, raw := range acks {
			p, _ := peer.Decode(f.ids[i])
			if _, err := w.replica.Accept(p, raw); err != nil {
				b.Fatalf("ack %d: %v", i, err)
			}
			for streamed.Load() < int64(i+1) {
				select {
				case <-rows:
				case err := <-waited:
					b.Fatalf("the wait ended after %d of %d acks: %v", streamed.Load(), n, err)
				}
			}
		}
		if err := <-waited; err != nil {
			b.Fatal(err)
		}
		return cpu() - start
	}
	per := make([]time.Duration, len(sizes))
	acks := make([]int, len(sizes))
	b.ResetTimer()
	for range b.N {
		for i, n := range sizes {
			per[i] += run(n)
			acks[i] += n
		}
	}
	small := float64(per[0]) / float64(acks[0]) / 1000
	large := float64(per[1]) / float64(acks[1]) / 1000
	b.ReportMetric(small, "cpu_us/ack@"+strconv.Itoa(sizes[0]))
	b.ReportMetric(large, "cpu_us/ack@"+strconv.Itoa(sizes[1]))
	b.ReportMetric(large/small, fmt.Sprintf("%d/%d", sizes[1], sizes[0]))
}

// BenchmarkJobWriterPasses: a trusted writer's periodic passes over the
// jobs it holds, at jobs of 100 targets and of 5,000, in one run: the
// collection each minute (which jobs are past their retention, which acks
// belong to jobs that are gone) and the look each 10 s for the acks its
// unfinished jobs miss (fetchMissingAcks; the targets here are not
// connected, so it asks none). It holds 10 finished jobs (every target
// acked done) and 10 unfinished ones (all but 10 targets acked: at 5,000
// hosts some are always down, and a job stays unfinished until it
// expires). The first pass after the acks came is not timed (it reads
// each job's acks once, as a list would). Reported: ms per pass of each
// kind at each size, and the ratios (target: flat in the jobs' size; each
// pass read every ack of every job).
func BenchmarkJobWriterPasses(b *testing.B) {
	const jobsHeld, down = 10, 10
	sizes := []int{100, jobs.MaxTargets}
	writers := make([]*Node, len(sizes))
	for i, n := range sizes {
		w := startNode(b, loopbackConfig(b, fmt.Sprintf("w%d", n)))
		keys, ids := identities(b, n)
		now := w.now()
		for job := range 2 * jobsHeld {
			id := writeJobTo(b, w, ids, time.Hour)
			acked := keys
			if job >= jobsHeld {
				acked = keys[:n-down]
			}
			es := make([]*gossip.Signed, len(acked))
			for t, key := range acked {
				p, _ := peer.Decode(ids[t])
				e, err := w.replica.Check(p, signAck(b, key, id, jobs.Ack{State: jobs.Done, Attempts: 1, OK: true, Started: now, Ended: now}))
				if err != nil {
					b.Fatal(err)
				}
				es[t] = e
			}
			if err := w.replica.Apply(es...); err != nil {
				b.Fatal(err)
			}
		}
		w.collectJobs()
		if !w.jobs.fetches.following() {
			b.Fatal("the writer follows none of its unfinished jobs")
		}
		w.fetchMissingAcks()
		writers[i] = w
	}
	collect := make([]time.Duration, len(sizes))
	fetch := make([]time.Duration, len(sizes))
	b.ResetTimer()
	for range b.N {
		for i, w := range writers {
			start := time.Now()
			w.collectJobs()
			collect[i] += time.Since(start)
			start = time.Now()
			w.fetchMissingAcks()
			fetch[i] += time.Since(start)
		}
	}
	for i, n := range sizes {
		b.ReportMetric(float64(collect[i].Microseconds())/1000/float64(b.N), fmt.Sprintf("collect_ms@%d", n))
		b.ReportMetric(float64(fetch[i].Microseconds())/1000/float64(b.N), fmt.Sprintf("fetch_ms@%d", n))
	}
	b.ReportMetric(float64(collect[1])/float64(collect[0]), fmt.Sprintf("collect_%d/%d", sizes[1], sizes[0]))
	b.ReportMetric(float64(fetch[1])/float64(fetch[0]), fmt.Sprintf("fetch_%d/%d", sizes[1], sizes[0]))
}

// identities makes n node identities: their keys, and their peer IDs as
// jobs name their targets.
func identities(t testing.TB, n int) ([]crypto.PrivKey, []string) {
	t.Helper()
	keys, ids := make([]crypto.PrivKey, n), make([]string, n)
	for i := range n {
		k, _, err := crypto.GenerateEd25519Key(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := peer.IDFromPrivateKey(k)
		keys[i], ids[i] = k, id.String()
	}
	return keys, ids
}

// writeJobTo writes, on w, a job to the nodes ids (by peer ID) that
// expires after expires, as SubmitJob would, without handing it to them
// (they need not exist: their acks are signed by the caller), and returns
// its id.
func writeJobTo(t testing.TB, w *Node, ids []string, expires time.Duration) string {
	t.Helper()
	now := w.now().UTC()
	j := jobs.Job{ID: w.newJobID(), Plugin: "echo", Method: "echo", Created: now, Expires: now.Add(expires)}
	j.SetTargets(ids)
	if err := j.Check(); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(j)
	if _, err := w.replica.PutQuiet(context.Background(), jobKey(j.ID), raw); err != nil {
		t.Fatal(err)
	}
	return j.ID
}

// ackClock orders the acks signAck signs: a later one replaces an earlier.
var ackClock struct {
	sync.Mutex
	last gossip.HLC
}

// signAck is the ack a of job id, signed by the target key.
func signAck(t testing.TB, key crypto.PrivKey, id string, a jobs.Ack) []byte {
	t.Helper()
	p, _ := peer.IDFromPrivateKey(key)
	v, _ := json.Marshal(a)
	ackClock.Lock()
	ackClock.last = gossip.Next(ackClock.last, time.Now())
	hlc := ackClock.last
	ackClock.Unlock()
	s, err := gossip.Sign(gossip.Entry{Key: ackKey(id, p), Value: v, HLC: hlc}, key)
	if err != nil {
		t.Fatal(err)
	}
	return s.Raw
}
