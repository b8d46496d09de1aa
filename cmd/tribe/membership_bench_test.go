package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api"
)

// serfVersion is the HashiCorp Serf the membership benchmark compares
// against, built from the module proxy into the Go build cache's dir.
const serfVersion = "v0.10.2"

// serfBin builds serf once (go install from the module proxy), or says
// why it cannot.
var serfBin = sync.OnceValues(func() (string, error) {
	dir := filepath.Join(os.TempDir(), "tribe-bench-serf-"+serfVersion)
	bin := filepath.Join(dir, "serf")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	cmd := exec.Command("go", "install", "github.com/hashicorp/serf/cmd/serf@"+serfVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install serf %s: %v\n%s", serfVersion, err, out)
	}
	return bin, nil
})

// BenchmarkMembership20And50 starts an agent on loopback, then N−1 more at
// once, each joining the first, and measures the time from their start
// until every agent lists all N alive; then idle CPU (over 30 s) and RSS per agent. The same
// for HashiCorp Serf's agents in the same run, where it builds; reported
// side by side with the ratios (target: tribe's convergence at most
// Serf's).
func BenchmarkMembership20And50(b *testing.B) {
	serf, serfErr := serfBin()
	if serfErr != nil {
		b.Logf("serf is left out: %v", serfErr)
	}
	for _, n := range []int{20, 50} {
		var t, sf fleetCost
		for range b.N {
			t.add(tribeMembership(b, n))
			if serfErr == nil {
				sf.add(serfMembership(b, serf, n))
			}
		}
		t.report(b, "tribe", n)
		if serfErr == nil {
			sf.report(b, "serf", n)
			b.ReportMetric(t.conv/sf.conv, fmt.Sprintf("converge_tribe/serf@%d", n)) // both summed over b.N runs
		}
	}
}

// fleetCost is what a fleet's run measured, per agent: seconds to
// converge, idle CPU in ms per minute, resident memory (RSS, PSS,
// anonymous) in MB; summed over runs until reported.
type fleetCost struct {
	runs      int
	conv, cpu float64
	convCPU   float64 // ms of CPU from each agent's start until all converged
	mem       mem
}

func (f *fleetCost) add(c fleetCost) {
	f.runs++
	f.conv, f.cpu, f.convCPU, f.mem = f.conv+c.conv, f.cpu+c.cpu, f.convCPU+c.convCPU, f.mem.plus(c.mem)
}

// mean is the cost per run.
func (f fleetCost) mean() fleetCost {
	k := float64(f.runs)
	return fleetCost{runs: 1, conv: f.conv / k, cpu: f.cpu / k, convCPU: f.convCPU / k, mem: f.mem.div(k)}
}

// report reports the means over the runs, as who's at n agents.
func (f fleetCost) report(b *testing.B, who string, n int) {
	m := f.mean()
	for _, r := range []struct {
		v    float64
		unit string
	}{{m.conv, "converge_s"}, {m.convCPU, "converge_cpu_ms"}, {m.cpu, "idle_cpu_ms_per_min"}, {m.mem.rss, "rss_MB"}, {m.mem.pss, "pss_MB"}, {m.mem.anon, "anon_MB"}} {
		b.ReportMetric(r.v, fmt.Sprintf("%s_%s@%d", who, r.unit, n))
	}
}

// idleWindow is how long idle CPU is measured over, after convergence and
// idleSettle.
const idleWindow = 30 * time.Second

// tribeMembership runs the tribe side.
func tribeMembership(b *testing.B, n int) fleetCost {
	agents := make([]*agentProc, n)
	agents[0] = newAgent(b, "m0", "--log-level", "warn")
	agents[0].start()
	seed := agents[0].tcpJoin()
	start := time.Now()
	for i := 1; i < n; i++ {
		agents[i] = newAgent(b, fmt.Sprintf("m%d", i), "--join", seed, "--log-level", "warn")
		agents[i].launch(exec.Command(tribeBin, agents[i].args...))
	}
	defer func() {
		for _, a := range agents {
			a.kill()
		}
	}()
	allAlive := func(a *agentProc) bool {
		nodes, err := api.NewClient(filepath.Join(a.dir, api.SocketName)).Nodes(context.Background(), "")
		if err != nil {
			return false
		}
		alive := 0
		for _, nd := range nodes {
			if nd.Liveness == "alive" {
				alive++
			}
		}
		return alive == n
	}
	waitAll(b, n, "tribe", func(i int) bool {
		if err, ended := agents[i].exited(); ended {
			b.Errorf("agent %s ended (%v):\n%s", agents[i].name, err, agents[i].log)
			return true // waiting longer would not help
		}
		return allAlive(agents[i])
	})
	if b.Failed() {
		b.FailNow()
	}
	conv := time.Since(start).Seconds()
	pids := make([]int, n)
	for i, a := range agents {
		pids[i] = a.cmd.Process.Pid
	}
	convCPU := fleetCPUms(b, pids)
	c := idleCost(b, pids)
	c.conv, c.convCPU = conv, convCPU
	return c
}

// serfMembership runs the same with serf agents.
func serfMembership(b *testing.B, serf string, n int) fleetCost {
	f, start := startSerf(b, serf, n, nil)
	defer f.kill()
	f.waitAlive(b, n)
	conv := time.Since(start).Seconds()
	convCPU := fleetCPUms(b, f.pids())
	c := idleCost(b, f.pids())
	c.conv, c.convCPU = conv, convCPU
	return c
}

// serfFleet is n serf agent processes on loopback.
type serfFleet struct {
	serf  string
	procs []*exec.Cmd
	rpc   []string        // each agent's RPC address, for the serf CLI
	logs  []*bytes.Buffer // each agent's output
	ended []chan struct{} // closed when the agent's process has ended
}

// startSerf starts n serf agents on loopback, the first alone and, once
// it answers, the others at once, each joining the first; extra, if not
// nil, adds agent i's flags. It returns when the others were started from.
func startSerf(b *testing.B, serf string, n int, extra func(i int) []string) (*serfFleet, time.Time) {
	f := &serfFleet{serf: serf}
	b.Cleanup(f.kill) // a failed benchmark leaves no agent running
	var seed string
	var start time.Time
	for i := range n {
		bind := fmt.Sprintf("127.0.0.1:%d", freeTCPAndUDPPort(b))
		rpc := fmt.Sprintf("127.0.0.1:%d", freeTCPAndUDPPort(b))
		args := []string{"agent", "-node", fmt.Sprintf("s%d", i), "-bind", bind, "-rpc-addr", rpc, "-log-level", "warn"}
		if i > 0 {
			args = append(args, "-join", seed)
		} else {
			seed = bind
		}
		if extra != nil {
			args = append(args, extra(i)...)
		}
		cmd := exec.Command(serf, args...)
		log := new(bytes.Buffer)
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			f.kill()
			b.Fatal(err)
		}
		ended := make(chan struct{})
		go func() {
			cmd.Wait()
			close(ended)
		}()
		f.procs, f.rpc = append(f.procs, cmd), append(f.rpc, rpc)
		f.logs, f.ended = append(f.logs, log), append(f.ended, ended)
		if i == 0 {
			waitEvery(b, 30*time.Second, 5*time.Millisecond, "serf agent to answer", func() bool {
				return exec.Command(serf, "members", "-rpc-addr", rpc).Run() == nil
			})
			start = time.Now()
		}
	}
	return f, start
}

// freeTCPAndUDPPort returns a port below the ephemeral range that was
// free a moment ago on loopback for both TCP and UDP, as a serf agent's
// bind needs (agents' QUIC listeners take UDP ports a TCP check does not
// see).
func freeTCPAndUDPPort(b *testing.B) int {
	for range 1000 {
		port := nextLowPort()
		t, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		c, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		t.Close()
		if err == nil {
			c.Close()
			return port
		}
	}
	b.Fatal("no port free for both TCP and UDP in 1,000 tries")
	return 0
}

// waitAlive waits until every agent lists all n alive; an agent that
// ended (a port taken between freeTCPAndUDPPort and its bind, say) fails the
// benchmark with its output.
func (f *serfFleet) waitAlive(b *testing.B, n int) {
	waitAll(b, n, "serf", func(i int) bool {
		select {
		case <-f.ended[i]:
			b.Errorf("serf agent s%d ended:\n%s", i, f.logs[i])
			return true // waiting longer would not help
		default:
		}
		out, err := exec.Command(f.serf, "members", "-rpc-addr", f.rpc[i], "-status", "alive", "-format", "json").Output()
		if err != nil {
			return false
		}
		var m struct{ Members []json.RawMessage }
		return json.Unmarshal(out, &m) == nil && len(m.Members) == n
	})
	if b.Failed() {
		b.FailNow()
	}
}

func (f *serfFleet) pids() []int {
	pids := make([]int, len(f.procs))
	for i, p := range f.procs {
		pids[i] = p.Process.Pid
	}
	return pids
}

// kill ends the agents, if they run.
func (f *serfFleet) kill() {
	for i, p := range f.procs {
		p.Process.Kill()
		<-f.ended[i]
	}
	f.procs = nil
}

// waitAll polls ok for every agent, at most 8 at a time, until all hold
// (at most five minutes).
func waitAll(b *testing.B, n int, what string, ok func(i int) bool) {
	deadline := time.Now().Add(5 * time.Minute)
	done := make([]bool, n)
	for left := n; left > 0; {
		if time.Now().After(deadline) {
			b.Fatalf("%s: %d of %d agents do not list all %d alive after 5 minutes", what, left, n, n)
		}
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for i := range n {
			if done[i] {
				continue
			}
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				done[i] = ok(i)
			})
		}
		wg.Wait()
		left = 0
		for _, d := range done {
			if !d {
				left++
			}
		}
		if left > 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// idleCost waits idleSettle, then measures the processes' CPU over
// idleWindow (ms per minute) and their memory at its end: means per
// process.
func idleCost(b *testing.B, pids []int) fleetCost {
	time.Sleep(idleSettle)
	before := make([]float64, len(pids))
	for i, pid := range pids {
		before[i] = procCPUms(b, pid)
	}
	time.Sleep(idleWindow)
	var c fleetCost
	for i, pid := range pids {
		c.cpu += (procCPUms(b, pid) - before[i]) * float64(time.Minute) / float64(idleWindow)
		c.mem = c.mem.plus(memOf(b, pid))
	}
	n := float64(len(pids))
	c.cpu, c.mem = c.cpu/n, c.mem.div(n)
	return c
}

// fleetCPUms is the CPU the processes have used so far, in ms per
// process: what converging cost, read the moment it is reached.
func fleetCPUms(b *testing.B, pids []int) float64 {
	var ms float64
	for _, pid := range pids {
		ms += procCPUms(b, pid)
	}
	return ms / float64(len(pids))
}

// procCPUms is a process's user and system CPU so far, in ms.
func procCPUms(b *testing.B, pid int) float64 {
	ms, err := readCPUms(pid)
	if err != nil {
		b.Fatal(err)
	}
	return ms
}

// readCPUms is a process's user and system CPU so far, in ms, from /proc.
func readCPUms(pid int) (float64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) * 10, nil // clock ticks of 10 ms
}
