package sim

import (
	"context"
	"flag"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tribeagent/tribe/node"
	"github.com/tribeagent/tribe/node/api"
)

// TestSimTimeJobVsCall: node 0 (the fleet is open: every node may write
// jobs) sends a durable job to every member of a tribe of all n nodes and
// waits until every target's ack says done, alternated with one call
// fan-out to the same members, in simulated time (-sim.jobs for the
// sizes). Where every node has its own CPU, what is left is the
// protocols' latency: the job hand-off and its ack on the same stream
// against a call and its answer. Issue 15's target, measured with real
// processes sharing this machine's two cores (BenchmarkJob25Agents): the
// job at most 2x the call.
//
// Two fleets of each size: one with a trust list (node 0 the trusted
// writer, admitting every node, as a fleet in production runs: acks go
// to the writer alone, and the job is published only to targets it could
// not hand it to) and an open one (every node may write, so every job is
// published too).
func TestSimTimeJobVsCall(t *testing.T) {
	simTimeOnly(t)
	for _, n := range jobSizes() {
		for _, trusted := range []bool{true, false} {
			t.Run(fmt.Sprintf("nodes=%d/trusted=%v", n, trusted), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					job, call := jobVsCall(t, n, trusted)
					t.Logf("nodes=%d trusted=%v  %.1f job_ms  %.1f call_ms  %.2f job/call_ratio (simulated time)", n, trusted, ms(job), ms(call), float64(job)/float64(call))
				})
			})
		}
	}
}

var simJobs = flag.String("sim.jobs", "25,100", "fleet sizes of TestSimTimeJobVsCall, comma-separated")

func jobSizes() []int { return fleetSizes(*simJobs) }

// jobVsCall returns the mean time of a job to all n nodes until every
// ack says done, and of a call to all of them until the last answer,
// over rounds alternated.
func jobVsCall(t *testing.T, n int, trusted bool) (job, call time.Duration) {
	cfg := Config{Nodes: n, Seed: 29, Sparse: n >= 1000, Net: SimNet}
	if trusted {
		cfg.Trusted = []int{0}
		cfg.Tune = func(i int, c *node.Config) {
			if i == 0 {
				c.AutoAdmit = "true"
			}
		}
	}
	s := quietCluster(t, cfg, false)
	defer s.Close()
	ctx, w := context.Background(), s.Node(0)
	if _, err := s.WaitFor(ctx, 10*time.Minute, func() bool {
		nodes, err := w.Nodes(ctx, "")
		admitted := 0
		for _, nd := range nodes {
			if nd.Admission != "pending" {
				admitted++
			}
		}
		return err == nil && admitted == n
	}); err != nil {
		t.Fatalf("node 0 has not admitted all %d nodes: %v", n, err)
	}
	echoToAll(t, s, 10*time.Minute)
	runJob := func() time.Duration {
		start := time.Now()
		j, err := w.SubmitJob(ctx, api.JobRequest{Tribes: []string{"all"}, Plugin: "echo", Method: "echo", Args: []byte(`{"ping":1}`)})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		done := 0
		if err := w.WaitJob(wctx, j.ID, func(r *api.JobTarget) {
			if r != nil && r.State == "done" {
				done++
			}
		}); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		if done != n {
			t.Fatalf("job %s: %d of %d targets done", j.ID, done, n)
		}
		return took
	}
	callAll(t, s) // every member connected once
	runJob()
	const rounds = 5
	for range rounds {
		call += callAll(t, s)
		job += runJob()
	}
	return job / rounds, call / rounds
}
