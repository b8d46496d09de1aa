package goplugin

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/tribeagent/tribe/plugins/external"
)

// BenchmarkEchoCall: one call with 100 bytes of arguments to an echo
// plugin in its own process, alternated in one run: tribe's protocol
// against go-plugin's gRPC; and each one's start (process and handshake).
func BenchmarkEchoCall(b *testing.B) {
	dir := b.TempDir()
	// tribe's side is its example plugin hello, built with plugins/sdk.
	for name, pkg := range map[string]string{"grpcecho": "./grpcecho", "sdkecho": "github.com/tribeagent/tribe/plugins/examples/hello"} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, name), pkg).CombinedOutput(); err != nil {
			b.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	startGRPC := func() (*plugin.Client, Client) {
		c := plugin.NewClient(&plugin.ClientConfig{HandshakeConfig: Handshake, Plugins: plugin.PluginSet{"echo": EchoPlugin{}},
			Cmd: exec.Command(filepath.Join(dir, "grpcecho")), AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
			Logger: hclog.NewNullLogger()})
		rpc, err := c.Client()
		if err != nil {
			b.Fatal(err)
		}
		raw, err := rpc.Dispense("echo")
		if err != nil {
			b.Fatal(err)
		}
		return c, raw.(Client)
	}
	startOurs := func() *external.Plugin {
		p, err := external.Start(filepath.Join(dir, "sdkecho"), external.Config{})
		if err != nil {
			b.Fatal(err)
		}
		return p
	}
	gc, grpcEcho := startGRPC()
	defer gc.Kill()
	ours := startOurs()
	defer ours.Close()

	ctx := context.Background()
	payload := `"` + strings.Repeat("x", 98) + `"`
	viaGRPC := func() time.Duration {
		t0 := time.Now()
		out, err := grpcEcho.Echo(ctx, []byte(payload))
		if err != nil || string(out) != payload {
			b.Fatalf("grpc: %q %v", out, err)
		}
		return time.Since(t0)
	}
	viaOurs := func() time.Duration {
		t0 := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		out, err := ours.Call(cctx, "echo", json.RawMessage(payload))
		cancel()
		if err != nil || string(out) != payload {
			b.Fatalf("ours: %q %v", out, err)
		}
		return time.Since(t0)
	}
	const calls = 2000
	for range calls / 10 { // warm up
		viaGRPC()
		viaOurs()
	}
	var tg, to time.Duration
	b.ResetTimer()
	for range b.N {
		for range calls {
			tg += viaGRPC()
			to += viaOurs()
		}
	}
	b.StopTimer()
	n := float64(calls * b.N)
	b.ReportMetric(float64(to.Microseconds())/n, "tribe_us")
	b.ReportMetric(float64(tg.Microseconds())/n, "goplugin_us")
	b.ReportMetric(float64(to)/float64(tg), "tribe/goplugin")

	var sg, so time.Duration
	const starts = 10
	for range starts {
		t0 := time.Now()
		c, _ := startGRPC()
		sg += time.Since(t0)
		c.Kill()
		t0 = time.Now()
		p := startOurs()
		so += time.Since(t0)
		p.Close()
	}
	b.ReportMetric(float64(so.Microseconds())/starts/1000, "tribe_start_ms")
	b.ReportMetric(float64(sg.Microseconds())/starts/1000, "goplugin_start_ms")
}
