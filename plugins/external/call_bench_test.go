package external

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/internal/catpipe"
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
	args := json.RawMessage(`"` + strings.Repeat("x", 98) + `"`)
	pipe := catpipe.Start(b, append(append([]byte{}, args...), '\n'))
	if pipe == nil {
		b.Skip("cat is not installed")
	}
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
