package node

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
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
