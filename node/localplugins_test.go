package node

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tribeagent/tribe/node/api"
)

// An executable in a host's plugin dir is a plugin there: loaded in a
// tribe by a writer that does not have it, run by the member that does,
// and called across the fleet like a built-in.
func TestLocalPluginLoadedAndCalled(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed: the example plugin pyecho needs it")
	}
	ctx := context.Background()
	a := startNode(t, loopbackConfig(t, "a"))
	bc := loopbackConfig(t, "b")
	bc.Join = []string{tcpAddr(a)}
	bc.PluginDir = t.TempDir()
	src, err := os.ReadFile(filepath.Join("..", "plugins", "examples", "pyecho", "pyecho"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bc.PluginDir, "pyecho"), src, 0o755); err != nil {
		t.Fatal(err)
	}
	b := startNode(t, bc)
	if a.registry.Has("pyecho") || b.registry.Source("pyecho") != "local" {
		t.Fatalf("registries: a has it %v, b's comes from %q", a.registry.Has("pyecho"), b.registry.Source("pyecho"))
	}
	if _, err := a.CreateTribe(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b known by name", func() bool { _, err := a.resolve([]string{"b"}); return err == nil })
	if _, err := a.Join(ctx, "t", []string{"b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.LoadPlugin(ctx, "pyecho", "t", api.LoadRequest{}); err != nil {
		t.Fatal(err)
	}
	var node api.PluginNode
	waitFor(t, "pyecho loaded on b", func() bool {
		ps, _ := a.Plugins(ctx, "t")
		if len(ps) == 1 && len(ps[0].Nodes) == 1 {
			node = ps[0].Nodes[0]
		}
		return node.State == "loaded"
	})
	if node.Source != "local" || node.Version != "1.0.0" {
		t.Fatalf("b's pyecho: %+v", node)
	}
	var got []api.CallResult
	sum, err := a.Call(ctx, api.CallRequest{Tribes: []string{"t"}, Plugin: "pyecho", Method: "echo", Args: []byte(`{"hi":[1,2]}`)},
		func(r api.CallResult) { got = append(got, r) })
	if err != nil || sum.Answered != 1 || len(got) != 1 || string(got[0].Result) != `{"hi":[1,2]}` {
		t.Fatalf("call: %+v %v %+v", sum, err, got)
	}
}

// A plugin's error is put in its node's record and its log, and some of it
// is text the plugin or a peer chose (a handshake refused with a 100 KB
// message, every peer's refusal of a shared plugin's fetch): cut to
// maxPluginErrorLen, it cannot make the record too large to write, nor
// fill the log.
func TestPluginErrorInRecordIsBounded(t *testing.T) {
	ctx := context.Background()
	c := loopbackConfig(t, "a")
	c.PluginDir = t.TempDir()
	script := "#!/bin/sh\nread line\nmsg=$(head -c 100000 /dev/zero | tr '\\0' x)\n" +
		`printf '{"jsonrpc":"2.0","id":0,"error":{"code":1,"message":"%s"}}\n' "$msg"` + "\nsleep 5\n"
	if err := os.WriteFile(filepath.Join(c.PluginDir, "bigerr"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	logs := newCaptureHandler()
	n := startNodeDeps(t, c, Deps{Logger: slog.New(logs)})
	jobTribe(t, n, "t", "echo", []*Node{n})
	if _, err := n.LoadPlugin(ctx, "bigerr", "t", api.LoadRequest{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "bigerr to fail to load", func() bool {
		l, ok := n.plugins.get("t", "bigerr")
		return ok && l.err != nil
	})
	if _, err := n.encodeRecord(n.facts.get()); err != nil {
		t.Fatalf("the record with bigerr's error: %v", err)
	}
	st := n.plugins.status(n.registry.Source)["t/bigerr"]
	if !strings.Contains(st.Error, "refused the handshake") || len(st.Error) > maxPluginErrorLen {
		t.Fatalf("bigerr's error in the record: %d bytes, %.100q", len(st.Error), st.Error)
	}
	logged := logs.attr(slog.LevelWarn, "plugin failed to load", "err")
	if len(logged) != 1 {
		t.Fatalf("bigerr's failure logged %d times, want once", len(logged))
	}
	if !strings.Contains(logged[0], "refused the handshake") || len(logged[0]) > maxPluginErrorLen {
		t.Fatalf("bigerr's error in the log: %d bytes, %.100q", len(logged[0]), logged[0])
	}
}
