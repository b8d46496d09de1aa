package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api"
)

// BenchmarkCLILatency: a command's whole round trip (process start, socket,
// answer, exit), the median of runs alternated in one run, against two
// baselines measured beside them: a static Go binary that does nothing
// (what any Go process costs to start and exit here), and a raw connect to
// the agent's socket. Targets (issue: footprint): `tribe --version` at
// most 10 ms, `tribe status` at most 20 ms.
func BenchmarkCLILatency(b *testing.B) {
	dir := b.TempDir()
	nothing := filepath.Join(dir, "nothing")
	os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nfunc main() {}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module nothing\n\ngo 1.26\n"), 0o644)
	build := exec.Command("go", "build", "-o", nothing, ".")
	build.Dir, build.Env = dir, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("building the do-nothing binary: %v\n%s", err, out)
	}
	a := newAgent(b, "cli")
	a.start()
	sock := filepath.Join(a.dir, api.SocketName)
	run := func(name string, args ...string) func() time.Duration {
		return func() time.Duration {
			t0 := time.Now()
			if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
				b.Fatalf("%s %v: %v\n%s", name, args, err, out)
			}
			return time.Since(t0)
		}
	}
	dial := func() time.Duration {
		t0 := time.Now()
		c, err := net.Dial("unix", sock)
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
		return time.Since(t0)
	}
	kinds := []struct {
		unit string
		f    func() time.Duration
	}{
		{"nothing_ms", run(nothing)},
		{"socket_connect_ms", dial},
		{"version_ms", run(tribeBin, "--version")},
		{"status_ms", run(tribeBin, "status", "--data-dir", a.dir)},
	}
	const runs = 25
	times := make([][]time.Duration, len(kinds))
	for _, k := range kinds { // warm: page cache, the agent's first answer
		k.f()
	}
	b.ResetTimer()
	for range b.N {
		for range runs {
			for i, k := range kinds {
				times[i] = append(times[i], k.f())
			}
		}
	}
	b.StopTimer()
	for i, k := range kinds {
		b.ReportMetric(float64(median(times[i]).Microseconds())/1000, k.unit)
	}
}

// BenchmarkCLIFanOutVsSerfQuery: a fan-out through the CLI, from process
// start to the last answer, against HashiCorp Serf's query to as many
// tagged agents, alternated in one run: 10 tagged agents of 20, then 25 of
// 50 (fleets on loopback, both logging at warn). tribe: `tribe call --tribe
// web echo echo` on the first agent, the tagged agents being web's
// members. Serf: `serf query -tag role=web echo` on the first agent, the
// tagged agents answering through the event handler query:echo=cat (the
// payload back, as echo does), timed until the last "Response from" line
// (the serf CLI itself waits out the query's timeout). The median of 20
// runs each; target: tribe at least 20x faster.
func BenchmarkCLIFanOutVsSerfQuery(b *testing.B) {
	serf, err := serfBin()
	if err != nil {
		b.Skipf("nothing to compare with: %v", err)
	}
	for _, size := range []struct{ n, tagged int }{{20, 10}, {50, 25}} {
		n, tagged := size.n, size.tagged
		agents, _ := echoFleet(b, fmt.Sprintf("q%d-", n), n, false, func(all []string) map[string][]string {
			return map[string][]string{"web": all[1 : 1+tagged]}
		}, "--log-level", "warn")
		fleet, _ := startSerf(b, serf, n, func(i int) []string {
			args := []string{"-event-handler", "query:echo=cat"}
			if i >= 1 && i <= tagged {
				args = append(args, "-tag", "role=web")
			}
			return args
		})
		fleet.waitAlive(b, n)
		tribeCall := func() time.Duration {
			t0 := time.Now()
			out, err := exec.Command(tribeBin, "call", "--data-dir", agents[0].dir, "--tribe", "web", "echo", "echo", `{"ping":1}`).CombinedOutput()
			if err != nil {
				b.Fatalf("tribe call: %v\n%s", err, out)
			}
			return time.Since(t0)
		}
		serfQuery := func() time.Duration {
			return untilResponses(b, tagged, serf, "query", "-rpc-addr", fleet.rpc[0], "-tag", "role=web", "-timeout", "10s", "echo", "ping")
		}
		tribeCall() // warm: connections, page cache
		serfQuery()
		const runs = 20
		var tribeTimes, serfTimes []time.Duration
		for range b.N {
			for range runs {
				// Each starts on a settled machine: a serf query leaves
				// its agents forking event handlers after its last
				// response line, which a call timed right after paid for.
				time.Sleep(settle)
				tribeTimes = append(tribeTimes, tribeCall())
				time.Sleep(settle)
				serfTimes = append(serfTimes, serfQuery())
			}
		}
		t, s := median(tribeTimes), median(serfTimes)
		at := fmt.Sprintf("@%dof%d", tagged, n)
		b.ReportMetric(float64(t.Microseconds())/1000, "tribe_call_ms"+at)
		b.ReportMetric(float64(s.Microseconds())/1000, "serf_query_ms"+at)
		b.ReportMetric(float64(s)/float64(t), "serf/tribe"+at)
		fleet.kill()
		for _, a := range agents {
			a.kill()
		}
	}
}

// settle is the pause before each timed fan-out in
// BenchmarkCLIFanOutVsSerfQuery.
const settle = 250 * time.Millisecond

// untilResponses runs the serf CLI with args and returns the time from its
// start until it has printed want "Response from" lines; then it is ended.
func untilResponses(b *testing.B, want int, serf string, args ...string) time.Duration {
	got, took, out := serfResponses(b, want, serf, args...)
	if got < want {
		b.Fatalf("serf %v: %d of %d responses:\n%s", args, got, want, strings.Join(out, "\n"))
	}
	return took
}

// serfResponses runs the serf CLI with args until it has printed want
// "Response from" lines (then it is ended) or it exits, and returns how
// many it printed, the time from its start to the last, and its output.
func serfResponses(b *testing.B, want int, serf string, args ...string) (got int, last time.Duration, out []string) {
	cmd := exec.Command(serf, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		out = append(out, sc.Text())
		if strings.HasPrefix(sc.Text(), "Response from") {
			if got, last = got+1, time.Since(t0); got == want {
				break
			}
		}
	}
	return got, last, out
}

// median is the middle of ds (sorted in place).
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}
