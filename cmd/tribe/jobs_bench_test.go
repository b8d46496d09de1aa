package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api"
)

// BenchmarkJob25Agents runs 25 agent processes on loopback, all in tribe
// j25 with echo loaded, the first the trusted writer (which admits the
// rest), as a fleet in production would be. Through the first one's API (as the CLI does) it
// measures, alternately in the same run: a durable job to the tribe from
// submit until every target's ack says done, and one `tribe call`
// fan-out to the same 25 (target: the job at most 2x the call). Then the
// jobs per second the tribe completes when 50 are submitted back to back
// (each target runs them one at a time, in order), the replicated state a
// finished job holds per target (its entry and acks, signed), and the
// state keys the writer and a target hold at the end.
func BenchmarkJob25Agents(b *testing.B) {
	const n = 25
	agents, c := echoFleet(b, "j", n, true, func(all []string) map[string][]string { return map[string][]string{"j25": all} })
	ctx := context.Background()
	call := func() time.Duration {
		start := time.Now()
		sum, err := c.Call(ctx, api.CallRequest{Tribes: []string{"j25"}, Plugin: "echo", Method: "echo", Args: []byte(`{"ping":1}`)},
			func(api.CallResult) {})
		if err != nil || sum.Answered != n {
			b.Fatalf("call: %+v %v", sum, err)
		}
		return time.Since(start)
	}
	submit := func() string {
		j, err := c.SubmitJob(ctx, api.JobRequest{Tribes: []string{"j25"}, Plugin: "echo", Method: "echo", Args: []byte(`{"ping":1}`)})
		if err != nil {
			b.Fatal(err)
		}
		return j.ID
	}
	wait := func(id string) api.Job {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := c.WaitJob(wctx, id, nil, func(api.JobTarget) {}); err != nil {
			b.Fatal(err)
		}
		j, err := c.Job(ctx, id)
		if err != nil || j.State != "done" || j.Counts["done"] != n {
			b.Fatalf("job %s after wait: %+v %v", id, j, err)
		}
		return j
	}
	job := func() time.Duration {
		start := time.Now()
		wait(submit())
		return time.Since(start)
	}
	call()
	job() // every member connected and acked once
	// What the idle fleet burns per second (presence, heartbeats), so
	// that an op's CPU counts only what the op cost.
	const idleFor = 3 * time.Second
	idleBefore := fleetCPU(b, agents)
	time.Sleep(idleFor)
	idleRate := float64(fleetCPU(b, agents)-idleBefore) / float64(idleFor)
	// cpu is the CPU time of all agents that ops of op and their tail
	// (what still spreads after the last returns) cost, less the idle
	// fleet's over as long: per op, per agent.
	cpu := func(ops int, op func() time.Duration) float64 {
		before, start := fleetCPU(b, agents), time.Now()
		for range ops {
			op()
		}
		time.Sleep(300 * time.Millisecond)
		idle := time.Duration(idleRate * float64(time.Since(start)))
		return float64((fleetCPU(b, agents) - before - idle).Microseconds()) / 1000 / float64(ops) / n
	}
	const rounds = 10
	var calls, jobs time.Duration
	b.ResetTimer()
	for range b.N {
		for range rounds {
			calls += call()
			jobs += job()
		}
	}
	b.StopTimer()
	r := float64(rounds * b.N)
	b.ReportMetric(float64(jobs.Microseconds())/1000/r, "job_ms")
	b.ReportMetric(float64(calls.Microseconds())/1000/r, "call_ms")
	b.ReportMetric(float64(jobs)/float64(calls), "job/call")
	// What one agent spends on a job, and on a call, across the fleet
	// (above idle, measured at 10 ms ticks): on one machine all 25 share
	// two cores, so the fleet's sum is the job's latency floor here, not
	// on 25 hosts.
	b.ReportMetric(cpu(rounds, job), "job_cpu_ms/agent")
	b.ReportMetric(cpu(5*rounds, call), "call_cpu_ms/agent")

	const burst = 50
	start := time.Now()
	ids := make([]string, burst)
	for i := range ids {
		ids[i] = submit()
	}
	var last api.Job
	for _, id := range ids {
		last = wait(id)
	}
	b.ReportMetric(burst/time.Since(start).Seconds(), "jobs/s")
	b.ReportMetric(float64(last.StateBytes)/n, "state_B/job/target")
	// The state keys the writer and a target hold after all those jobs:
	// a job and an ack per target on the writer, a job and its own ack
	// on a target (acks go to the writer only).
	time.Sleep(time.Second) // the last acks' anti-entropy, if any
	for _, who := range []struct {
		a    *agentProc
		unit string
	}{{agents[0], "writer_keys"}, {agents[1], "target_keys"}} {
		st, err := api.NewClient(filepath.Join(who.a.dir, api.SocketName)).Status(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(st.Entries), who.unit)
	}
}

// fleetCPU is the CPU time (user and system) the agents' processes used
// so far, from /proc/<pid>/stat.
func fleetCPU(b *testing.B, agents []*agentProc) time.Duration {
	var ms float64
	for _, a := range agents {
		ms += procCPUms(b, a.cmd.Process.Pid)
	}
	return time.Duration(ms * float64(time.Millisecond))
}
