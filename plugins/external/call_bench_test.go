package external

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/internal/syncbuf"
)

// BenchmarkCallVsPipe: one call with 100 bytes to an SDK plugin (this
// test binary, as the plugin "good"), without the network around it,
// against the same line through cat and back, alternated: what the
// protocol, the SDK and the agent's reading cost above the pipe itself.
// Both processes are idle for a millisecond before each, as a plugin is
// between calls (a busy one answers faster: its threads are awake).
func BenchmarkCallVsPipe(b *testing.B) {
	p, err := Start(pluginPathB(b, "good"), testConfig(&syncbuf.Buffer{}))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	catPath, err := exec.LookPath("cat")
	if err != nil {
		b.Skip("cat is not installed")
	}
	cat := exec.Command(catPath)
	in, _ := cat.StdinPipe()
	out, _ := cat.StdoutPipe()
	if err := cat.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { in.Close(); cat.Wait() }()
	args := json.RawMessage(`"` + strings.Repeat("x", 98) + `"`)
	line, got := append(append([]byte{}, args...), '\n'), make([]byte, 4096)
	call := func() time.Duration {
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r, err := p.Call(ctx, "echo", args)
		if err != nil || string(r) != string(args) {
			b.Fatalf("echo: %s %v", r, err)
		}
		return time.Since(t0)
	}
	pipe := func() time.Duration {
		t0 := time.Now()
		in.Write(line)
		for n := 0; n < len(line); {
			m, err := out.Read(got[n:])
			if err != nil {
				b.Fatal(err)
			}
			n += m
		}
		return time.Since(t0)
	}
	const seq, idle = 300, time.Millisecond
	var calls, pipes time.Duration
	for b.Loop() {
		for range seq {
			time.Sleep(idle)
			calls += call()
			time.Sleep(idle)
			pipes += pipe()
		}
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 / float64(seq*b.N) }
	b.ReportMetric(per(calls), "call_us")
	b.ReportMetric(per(pipes), "pipe_us")
	b.ReportMetric(float64(calls)/float64(pipes), "call/pipe")
}
