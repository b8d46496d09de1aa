package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
		slices.Sort(times[i])
		b.ReportMetric(float64(times[i][len(times[i])/2].Microseconds())/1000, k.unit)
	}
}
