package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/internal/resident"
	"github.com/tribeagent/tribe/node/api"
)

// idleSettle is how long agents idle before their memory is read: long
// enough for start-up garbage to be collected and discovery to go quiet.
const idleSettle = 10 * time.Second

// asUsersRun is the log level agents run at in the memory benchmarks: the
// default. The harness's debug level would weigh on what is measured:
// every record logged walks its caller's stack (slog keeps its PC), and
// with it Go's function tables, which then stay resident.
var asUsersRun = []string{"--log-level", "info"}

// BenchmarkAgentStartToReady measures, per iteration, the time from exec
// of `tribe agent` until its API answers, against the time to exec and
// finish `tribe --version` (process start and Go runtime start-up) measured
// alternately in the same run.
func BenchmarkAgentStartToReady(b *testing.B) {
	var agent, baseline time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if out, err := exec.Command(tribeBin, "--version").CombinedOutput(); err != nil {
			b.Fatalf("tribe --version: %v: %s", err, out)
		}
		baseline += time.Since(start)

		a := newAgent(b, fmt.Sprintf("s%d", i))
		start = time.Now()
		a.start()
		agent += time.Since(start)
		a.kill()
	}
	n := float64(b.N)
	b.ReportMetric(float64(agent.Microseconds())/1000/n, "ready_ms")
	b.ReportMetric(float64(baseline.Microseconds())/1000/n, "exec_version_ms")
	b.ReportMetric(float64(agent)/float64(baseline), "ready/exec_ratio")
}

// BenchmarkAgentIdleRSS is the resident memory of one idle agent (target:
// at most 20 MB, and at most Serf's) and its proportional share (PSS) and
// anonymous part; beside it, measured the same way in the same run, one
// idle HashiCorp Serf agent, where serf builds.
func BenchmarkAgentIdleRSS(b *testing.B) {
	serf, serfErr := serfBin()
	if serfErr != nil {
		b.Logf("serf is left out: %v", serfErr)
	}
	for i := 0; i < b.N; i++ {
		a := newAgent(b, "idle", asUsersRun...)
		a.start()
		time.Sleep(idleSettle)
		m := memOf(b, a.cmd.Process.Pid)
		a.kill()
		b.ReportMetric(m.rss, "rss_MB")
		b.ReportMetric(m.pss, "pss_MB")
		b.ReportMetric(m.anon, "anon_MB")
		b.ReportMetric(m.rss/20, "rss/target_ratio")
		if serfErr != nil {
			continue
		}
		f, _ := startSerf(b, serf, 1, nil)
		time.Sleep(idleSettle)
		sm := memOf(b, f.procs[0].Process.Pid)
		f.kill()
		b.ReportMetric(sm.rss, "serf_rss_MB")
		b.ReportMetric(sm.anon, "serf_anon_MB")
		b.ReportMetric(m.rss/sm.rss, "rss_tribe/serf")
	}
}

// BenchmarkCluster20IdleRSS runs 20 agents on loopback, all joined through
// the first, lets them find each other and go idle (a minute: joining
// touches code for a while, and the agents give back the binary's pages
// 5, 35 and 95 s after ready), and reports resident memory per agent: mean
// and max RSS, mean PSS (RSS with the pages the agents share, such as the
// binary's, split between them) and mean anonymous memory (the heap,
// stacks: what each agent costs alone).
func BenchmarkCluster20IdleRSS(b *testing.B) {
	const n = 20
	for i := 0; i < b.N; i++ {
		agents := make([]*agentProc, n)
		agents[0] = newAgent(b, "c0", asUsersRun...)
		agents[0].start()
		seed := agents[0].tcpJoin()
		for j := 1; j < n; j++ {
			agents[j] = newAgent(b, fmt.Sprintf("c%d", j), append([]string{"--join", seed}, asUsersRun...)...)
			agents[j].start()
		}
		deadline := time.Now().Add(2 * time.Minute)
		for _, a := range agents {
			for a.status().Peers < 3 {
				if time.Now().After(deadline) {
					b.Fatalf("%s has %d peers", a.name, a.status().Peers)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		time.Sleep(clusterSettle)
		var sum, most mem
		for _, a := range agents {
			m := memOf(b, a.cmd.Process.Pid)
			sum = sum.plus(m)
			most.rss = max(most.rss, m.rss)
		}
		for _, a := range agents {
			a.kill()
		}
		b.ReportMetric(sum.rss/n, "rss_mean_MB")
		b.ReportMetric(most.rss, "rss_max_MB")
		b.ReportMetric(sum.pss/n, "pss_mean_MB")
		b.ReportMetric(sum.anon/n, "anon_mean_MB")
	}
}

// clusterSettle is how long a cluster idles before its memory is read.
const clusterSettle = time.Minute

// mem is a process's resident memory in MB.
type mem struct{ rss, pss, anon float64 }

// memOf reads a process's RSS, PSS and anonymous memory from /proc.
func memOf(b *testing.B, pid int) mem {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	maps, err := resident.ParseSmaps(f)
	if err != nil || len(maps) != 1 {
		b.Fatalf("smaps_rollup of %d: %d ranges, %v", pid, len(maps), err)
	}
	const mb = 1 << 20
	return mem{float64(maps[0].RSS) / mb, float64(maps[0].PSS) / mb, float64(maps[0].Anon) / mb}
}

// plus is m and o summed.
func (m mem) plus(o mem) mem { return mem{m.rss + o.rss, m.pss + o.pss, m.anon + o.anon} }

// div is m divided by k (a mean over k).
func (m mem) div(k float64) mem { return mem{m.rss / k, m.pss / k, m.anon / k} }

// BenchmarkFanOut25Agents runs 25 agent processes on loopback; the first
// puts all 25 in tribe f25 and 5 of them in f5 and loads echo in both.
// Through its API (as `tribe call` does) it then calls, alternately in
// the same run: one member alone, every member of f5, every member of f25.
// Reported: the time until the last answer, and the fan-outs' ratios to
// the single call (target for 25: at most 5x).
func BenchmarkFanOut25Agents(b *testing.B) {
	const n = 25
	_, c := echoFleet(b, "f", n, false, func(all []string) map[string][]string {
		return map[string][]string{"f25": all, "f5": all[1:6]}
	})
	ctx := context.Background()
	call := func(req api.CallRequest) time.Duration {
		req.Plugin, req.Method, req.Args = "echo", "echo", []byte(`{"ping":1}`)
		start := time.Now()
		sum, err := c.Call(ctx, req, func(api.CallResult) {})
		if err != nil {
			b.Fatal(err)
		}
		if sum.Answered != sum.Targets {
			b.Fatalf("%+v: not every member answered", sum)
		}
		return time.Since(start)
	}
	one := api.CallRequest{Nodes: []string{"f1"}}
	f5 := api.CallRequest{Tribes: []string{"f5"}}
	f25 := api.CallRequest{Tribes: []string{"f25"}}
	call(f25) // every member connected once
	const rounds = 20
	var single, fan5, fan25 time.Duration
	b.ResetTimer()
	for range b.N {
		for range rounds {
			single += call(one)
			fan5 += call(f5)
			fan25 += call(f25)
		}
	}
	r := float64(rounds * b.N)
	b.ReportMetric(float64(single.Microseconds())/1000/r, "one_ms")
	b.ReportMetric(float64(fan5.Microseconds())/1000/r, "fan5_ms")
	b.ReportMetric(float64(fan25.Microseconds())/1000/r, "fan25_ms")
	b.ReportMetric(float64(fan5)/float64(single), "fan5/one")
	b.ReportMetric(float64(fan25)/float64(single), "fan25/one")
}

// echoFleet starts n agent processes on loopback (prefix0 is the seed the
// others --join), waits until the first knows them all, makes the tribes
// tribes(names) asks for and loads echo in each, and waits until every
// member has it loaded. extra flags go to every agent. It returns the
// agents and a client of the first.
func echoFleet(b *testing.B, prefix string, n int, trusted bool, tribes func(names []string) map[string][]string, extra ...string) ([]*agentProc, *api.Client) {
	b.Helper()
	agents := make([]*agentProc, n)
	agents[0] = newAgent(b, prefix+"0", extra...)
	var trust []string
	if trusted { // the first is the trusted writer and admits the rest
		trust = []string{"--trusted", presetIdentity(b, agents[0])}
		agents[0].args = append(agents[0].args, append(trust, "--auto-admit", "true")...)
	}
	agents[0].start()
	seed := agents[0].tcpJoin()
	for j := 1; j < n; j++ {
		agents[j] = newAgent(b, fmt.Sprintf("%s%d", prefix, j), append(append([]string{"--join", seed}, trust...), extra...)...)
		agents[j].start()
	}
	c := api.NewClient(filepath.Join(agents[0].dir, api.SocketName))
	ctx := context.Background()
	// Two minutes, and a second more per agent past 100.
	started := time.Now()
	deadline := started.Add(2*time.Minute + time.Duration(max(0, n-100))*time.Second)
	for said := started; ; {
		nodes, err := c.Nodes(ctx, "")
		pending := 0
		for _, nd := range nodes {
			if nd.Admission == "pending" {
				pending++
			}
		}
		if err == nil && len(nodes) == n && pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the first agent knows %d of %d nodes %v after the last started%s", len(nodes), n, time.Since(started).Round(time.Second), unknownTo(agents, nodes))
		}
		if time.Since(said) >= 30*time.Second {
			said = time.Now()
			b.Logf("%v after the last started, the first agent knows %d of %d nodes", time.Since(started).Round(time.Second), len(nodes), n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var all []string
	for _, a := range agents {
		all = append(all, a.name)
	}
	want := 0
	for tribe, members := range tribes(all) {
		want += len(members)
		if _, err := c.CreateTribe(ctx, tribe); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Join(ctx, tribe, members); err != nil {
			b.Fatal(err)
		}
		if _, err := c.LoadPlugin(ctx, "echo", tribe, api.LoadRequest{}); err != nil {
			b.Fatal(err)
		}
	}
	// Loading gets as long again, from when it was asked.
	asked := time.Now()
	deadline = asked.Add(deadline.Sub(started))
	for said := asked; ; {
		ps, err := c.Plugins(ctx, "")
		loaded, states := 0, map[string]int{}
		for _, p := range ps {
			for _, pn := range p.Nodes {
				if states[pn.State]++; pn.State == "loaded" {
					loaded++
				}
			}
		}
		if err == nil && loaded == want {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("echo loaded on %d of %d members %v after it was asked (states the first agent holds: %v; error: %v)",
				loaded, want, time.Since(asked).Round(time.Second), states, err)
		}
		if time.Since(said) >= 30*time.Second {
			said = time.Now()
			b.Logf("%v after echo was loaded, the first agent holds it loaded on %d of %d members", time.Since(asked).Round(time.Second), loaded, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return agents, c
}

// unknownTo names the agents missing from nodes (what the first agent
// lists) and says how the first few of them stand, for a failure message.
func unknownTo(agents []*agentProc, nodes []api.Node) string {
	known := map[string]bool{}
	for _, nd := range nodes {
		known[nd.Name] = true
	}
	var out strings.Builder
	shown := 0
	for _, a := range agents {
		if known[a.name] {
			continue
		}
		fmt.Fprintf(&out, "\n  %s is unknown", a.name)
		if shown++; shown > 5 {
			continue
		}
		c := api.NewClient(filepath.Join(a.dir, api.SocketName))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := c.Status(ctx)
		them, err2 := c.Nodes(ctx, "")
		cancel()
		fmt.Fprintf(&out, ": %d peers, %d entries, knows %d nodes (errors: %v, %v)", st.Peers, st.Entries, len(them), err, err2)
		for _, j := range st.Joins {
			fmt.Fprintf(&out, "\n    join %s: %s %s", j.Addr, j.State, j.Error)
		}
		fmt.Fprintf(&out, "\n    its log ends:\n%s", logTail(a.log.String(), 20))
	}
	return out.String()
}

// logTail is the last n lines of log, indented, for a failure message.
func logTail(log string, n int) string {
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	lines = lines[max(0, len(lines)-n):]
	return "      " + strings.Join(lines, "\n      ")
}
