package node

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/internal/catpipe"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/plugins/external"
)

// BenchmarkExternalVsBuiltinCall: the price of the process boundary. Two
// real nodes on loopback; a calls b, one call at a time on streams kept
// between calls (as a node calls), with 100 bytes of arguments: the
// built-in echo against the example plugins hello (Go, the SDK) and pyecho
// (Python 3), alternated in one run. Target: an external call at most
// 1.5x the built-in's. a and b share this process, so a's call to b's
// built-in crosses no process boundary at all; the same calls go to c, a
// real agent process with its own copies of the plugins, as a call
// between two hosts does (agent_*). Also how long a plugin takes to start
// (process and handshake), the median of 10.
func BenchmarkExternalVsBuiltinCall(b *testing.B) {
	dir := b.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "hello"), "../plugins/examples/hello")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("building the example plugin hello: %v\n%s", err, out)
	}
	names := []string{"echo", "hello"}
	if _, err := exec.LookPath("python3"); err == nil {
		src, err := os.ReadFile("../plugins/examples/pyecho/pyecho")
		if err != nil {
			b.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "pyecho"), src, 0o755)
		names = append(names, "pyecho")
	} else {
		b.Log("python3 is not installed: pyecho is left out")
	}
	a := startNode(b, loopbackConfig(b, "a"))
	cb := loopbackConfig(b, "b")
	cb.Join, cb.PluginDir = []string{tcpAddr(a)}, dir
	bn := startNode(b, cb)
	ctx := context.Background()
	waitFor(b, "a and b to know each other", func() bool { return len(a.nodeRecords()) == 2 && len(bn.nodeRecords()) == 2 })
	if _, err := a.CreateTribe(ctx, "bench"); err != nil {
		b.Fatal(err)
	}
	if _, err := a.Join(ctx, "bench", []string{"b"}); err != nil {
		b.Fatal(err)
	}
	for _, name := range names {
		if _, err := a.LoadPlugin(ctx, name, "bench", api.LoadRequest{}); err != nil {
			b.Fatal(err)
		}
		waitFor(b, "b to load "+name, func() bool { _, ok := bn.plugins.get("bench", name); return ok })
	}
	waitFor(b, "b a member on a", func() bool { return a.isMember("bench", bn.ID()) })
	cID := startAgentProcess(b, a, dir, names[1:])
	if _, err := a.Join(ctx, "bench", []string{"c"}); err != nil {
		b.Fatal(err)
	}
	args := json.RawMessage(`"` + strings.Repeat("x", 98) + `"`)
	// The least a process boundary costs here: a line to cat and back,
	// alternated with the calls (the VM's wake-ups of an idle process
	// are most of it).
	pipe := catpipe.Start(b, append(append([]byte{}, args...), '\n'))
	caller := plugins.NewCaller(a.host, 8) // streams kept between calls, as the node's
	defer caller.Close()
	callOn := func(to peer.ID, plugin string) time.Duration {
		start := time.Now()
		r := caller.Call(ctx, to, plugins.Request{ID: "x", Tribe: "bench", Plugin: plugin, Method: "echo", Args: args})
		if !r.OK || string(r.Result) != string(args) {
			b.Fatalf("%s on %s: %+v", plugin, to, r)
		}
		return time.Since(start)
	}
	call := func(plugin string) time.Duration { return callOn(bn.ID(), plugin) }
	for _, name := range names {
		waitFor(b, "c to answer a call to "+name, func() bool {
			r := caller.Call(ctx, cID, plugins.Request{ID: "x", Tribe: "bench", Plugin: name, Method: "echo", Args: args})
			return r.OK
		})
	}
	const seq = 300
	lat := map[string]time.Duration{}
	for _, name := range names { // warm up
		for range seq {
			call(name)
			callOn(cID, name)
		}
	}
	cpu0 := map[string]time.Duration{}
	for _, name := range names[1:] {
		cpu0[name] = processCPU(b, filepath.Join(dir, name))
	}
	b.ResetTimer()
	for range b.N {
		for range seq {
			for _, name := range names {
				lat[name] += call(name)
				lat["agent_"+name] += callOn(cID, name)
			}
			if pipe != nil {
				lat["pipe"] += pipe()
			}
		}
	}
	b.StopTimer()
	for _, name := range names[1:] {
		used := processCPU(b, filepath.Join(dir, name)) - cpu0[name]
		b.ReportMetric(float64(used.Microseconds())/float64(seq*b.N), name+"_cpu_us")
	}
	per := func(name string) float64 { return float64(lat[name].Microseconds()) / float64(seq*b.N) }
	b.ReportMetric(per("echo"), "builtin_us")
	if pipe != nil {
		b.ReportMetric(per("pipe"), "pipe_us")
	}
	for _, name := range names[1:] {
		b.ReportMetric(per(name), name+"_us")
		b.ReportMetric(per(name)/per("echo"), name+"/builtin")
	}
	b.ReportMetric(per("agent_echo"), "agent_builtin_us")
	for _, name := range names[1:] {
		b.ReportMetric(per("agent_"+name)/per("agent_echo"), "agent_"+name+"/builtin")
	}
	for _, name := range names[1:] {
		var starts []time.Duration
		for range 10 {
			t0 := time.Now()
			p, err := external.Start(filepath.Join(dir, name), external.Config{})
			if err != nil {
				b.Fatal(err)
			}
			starts = append(starts, time.Since(t0))
			p.Close()
		}
		slices.Sort(starts)
		b.ReportMetric(float64(starts[len(starts)/2].Microseconds())/1000, name+"_start_ms")
	}
}

// processCPU is the CPU time (user and system) the process running the
// executable (or script) at path has used so far, read from /proc.
func processCPU(b *testing.B, path string) time.Duration {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cmdline, err := os.ReadFile(filepath.Join(d, "cmdline"))
		// A script runs as its interpreter with its path as an argument.
		if err != nil || !slices.ContainsFunc(bytes.Split(cmdline, []byte{0}), func(a []byte) bool { return string(a) == path }) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue
		}
		// The fields after the command's name, which is in parentheses.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
	}
	b.Fatalf("no process runs %s", path)
	return 0
}

// startAgentProcess runs c, a tribe agent process built from this tree,
// joined to a, with its own copies of the plugins in dir, and returns its
// peer ID once a knows it.
func startAgentProcess(b *testing.B, a *Node, dir string, plugs []string) peer.ID {
	bin := filepath.Join(dir, "tribe-agent")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/tribe").CombinedOutput(); err != nil {
		b.Fatalf("building tribe: %v\n%s", err, out)
	}
	data := b.TempDir()
	os.MkdirAll(filepath.Join(data, "plugins"), 0o755)
	for _, name := range plugs {
		src, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			b.Fatal(err)
		}
		os.WriteFile(filepath.Join(data, "plugins", name), src, 0o755)
	}
	cmd := exec.Command(bin, "agent", "--data-dir", data, "--name", "c", "--no-mdns",
		"--listen", "/ip4/127.0.0.1/tcp/0", "--join", tcpAddr(a), "--log-level", "warn")
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	client := api.NewClient(filepath.Join(data, api.SocketName))
	var id peer.ID
	waitFor(b, "the agent process c to answer", func() bool {
		st, err := client.Status(context.Background())
		if err != nil {
			return false
		}
		id, err = peer.Decode(st.ID)
		return err == nil
	})
	waitFor(b, "a to know c", func() bool { _, ok := a.nodeNamed(id); return ok })
	return id
}
