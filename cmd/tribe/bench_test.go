package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// idleSettle is how long agents idle before their memory is read: long
// enough for start-up garbage to be collected and discovery to go quiet.
const idleSettle = 10 * time.Second

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
// at most 20 MB) and its proportional share (PSS).
func BenchmarkAgentIdleRSS(b *testing.B) {
	for i := 0; i < b.N; i++ {
		a := newAgent(b, "idle")
		a.start()
		time.Sleep(idleSettle)
		rss, pss := memOf(b, a.cmd.Process.Pid)
		a.kill()
		b.ReportMetric(rss, "rss_MB")
		b.ReportMetric(pss, "pss_MB")
		b.ReportMetric(rss/20, "rss/target_ratio")
	}
}

// BenchmarkCluster20IdleRSS runs 20 agents on loopback, all joined through
// the first, lets them find each other and go idle, and reports resident
// memory per agent: mean and max RSS, and mean PSS (RSS with the pages the
// agents share, such as the binary's, split between them).
func BenchmarkCluster20IdleRSS(b *testing.B) {
	const n = 20
	for i := 0; i < b.N; i++ {
		agents := make([]*agentProc, n)
		agents[0] = newAgent(b, "c0")
		agents[0].start()
		seed := agents[0].tcpJoin()
		for j := 1; j < n; j++ {
			agents[j] = newAgent(b, fmt.Sprintf("c%d", j), "--join", seed)
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
		time.Sleep(idleSettle)
		var sumRSS, maxRSS, sumPSS float64
		for _, a := range agents {
			rss, pss := memOf(b, a.cmd.Process.Pid)
			sumRSS += rss
			sumPSS += pss
			maxRSS = max(maxRSS, rss)
		}
		for _, a := range agents {
			a.kill()
		}
		b.ReportMetric(sumRSS/n, "rss_mean_MB")
		b.ReportMetric(maxRSS, "rss_max_MB")
		b.ReportMetric(sumPSS/n, "pss_mean_MB")
	}
}

// memOf reads a process's RSS and PSS in MB from /proc.
func memOf(b *testing.B, pid int) (rss, pss float64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, err := strconv.ParseFloat(fields[1], 64)
		if err != nil {
			continue
		}
		switch fields[0] {
		case "Rss:":
			rss = kb / 1024
		case "Pss:":
			pss = kb / 1024
		}
	}
	return rss, pss
}
