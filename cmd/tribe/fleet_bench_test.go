package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkFanOut200Agents: 200 agent processes on loopback (the first
// is the seed the others --join; the DHT on and every limit at its
// default), all in tribe "all" with echo loaded. `tribe call --tribe all
// echo echo`, the CLI as a user runs it, must answer every one of them
// (issue 14: 200 of 200, no special flags). Alternated in the same run:
// the same CLI call to one member alone. Reported: the medians of both,
// their ratio, and the peers the caller holds after the fan-outs (a call
// closes the connections it opened beyond the connection manager's low
// water mark).
//
// It runs only with TRIBE_BENCH_AGENTS set (the fleet size; 200 is the
// issue's): on a 2-core machine such a fleet does not form. Measured
// there, 180 agents starting at once used about 1 s of CPU a minute each,
// both cores for as long as they ran; 100 kept both cores busy for
// minutes, their APIs slow to answer.
func BenchmarkFanOut200Agents(b *testing.B) {
	n, err := strconv.Atoi(os.Getenv("TRIBE_BENCH_AGENTS"))
	if err != nil || n < 2 {
		b.Skip("set TRIBE_BENCH_AGENTS=200 (agent processes; more than a 2-core machine holds)")
	}
	agents, _ := echoFleet(b, "h", n, false, func(all []string) map[string][]string {
		return map[string][]string{"all": all}
	}, "--log-level", "warn")
	caller := agents[0]
	// call runs the tribe CLI's call to target and fails unless want
	// targets answered ok; it returns the command's whole run.
	call := func(want int, target ...string) time.Duration {
		t0 := time.Now()
		results, stderr, code := callLines(b, caller, append(append([]string{"--timeout", "2m"}, target...), "echo", "echo", `{"ping":1}`)...)
		took := time.Since(t0)
		ok := 0
		failed := map[string]int{} // by code
		var first []string
		for _, r := range results {
			if r.OK {
				ok++
				continue
			}
			failed[r.Code]++
			if len(first) < 5 {
				first = append(first, fmt.Sprintf("%s: %s (%s, %.0f ms)", r.Name, r.Error, r.Code, r.MS))
			}
		}
		if code != 0 || ok != want {
			b.Fatalf("tribe call %v: %d of %d answered ok (exit %d); failed by code %v, the first: %s\n%s",
				target, ok, want, code, failed, strings.Join(first, "; "), stderr)
		}
		return took
	}
	all, one := []string{"--tribe", "all"}, []string{"--node", agents[n/2].name}
	b.Logf("%d of %d answered the first fan-out in %v", n, n, call(n, all...))
	const rounds = 5
	var fan, single []time.Duration
	b.ResetTimer()
	for range b.N {
		for range rounds {
			single = append(single, call(1, one...))
			fan = append(fan, call(n, all...))
		}
	}
	b.StopTimer()
	f, s := median(fan), median(single)
	at := "@" + strconv.Itoa(n)
	b.ReportMetric(float64(f.Microseconds())/1000, "fanout_ms"+at)
	b.ReportMetric(float64(s.Microseconds())/1000, "one_ms")
	b.ReportMetric(float64(f)/float64(s), "fanout/one"+at)
	b.ReportMetric(float64(caller.status().Peers), "caller_peers_after")
}
