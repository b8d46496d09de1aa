package node

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/keys"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins"
)

// identity creates the node's key ahead of time, so its ID can go in
// other nodes' trust lists.
func identity(t *testing.T, c Config) peer.ID {
	t.Helper()
	key, _, err := keys.LoadOrCreateIdentity(filepath.Join(c.DataDir, keys.IdentityFile))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(key)
	return id
}

func startNodeDeps(t testing.TB, c Config, deps Deps) *Node {
	t.Helper()
	n, err := New(c, deps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return n
}

func call(t *testing.T, from *Node, req api.CallRequest) map[string]api.CallResult {
	t.Helper()
	out := map[string]api.CallResult{}
	sum, err := from.Call(context.Background(), req, func(r api.CallResult) { out[r.Name] = r })
	if err != nil {
		t.Fatal(err)
	}
	if sum.Targets != len(out) || sum.Answered+sum.Failed+sum.TimedOut != sum.Targets {
		t.Fatalf("summary %+v does not add up over %d results", sum, len(out))
	}
	return out
}

func pluginStates(n *Node, tribe string) map[string]string {
	ps, _ := n.Plugins(context.Background(), tribe)
	out := map[string]string{}
	for _, p := range ps {
		for _, pn := range p.Nodes {
			out[pn.Name] = pn.State
		}
	}
	return out
}

// Four real nodes on loopback: admin (the one trusted writer, in no
// tribe), b and c (members of t; c's agent has no echo plugin), d (neither
// trusted nor a member).
func TestPluginsLoadPerTribeAndCallsAreAuthorized(t *testing.T) {
	ca := loopbackConfig(t, "admin")
	adminID := identity(t, ca)
	ca.Trusted = []string{adminID.String()}
	admin := startNode(t, ca)
	seed := tcpAddr(admin)
	start := func(name string, deps Deps) *Node {
		c := loopbackConfig(t, name)
		c.Trusted, c.Join = ca.Trusted, []string{seed}
		return startNodeDeps(t, c, deps)
	}
	b := start("b", Deps{})
	noEcho := plugins.NewRegistry()
	noEcho.Register("sys", func(map[string]string) (plugins.Plugin, error) { return nil, nil })
	c := start("c", Deps{Plugins: noEcho})
	d := start("d", Deps{})
	all := []*Node{admin, b, c, d}
	waitFor(t, "every node to know all four", func() bool {
		for _, n := range all {
			if len(n.nodeRecords()) != 4 {
				return false
			}
		}
		return true
	})
	ctx := context.Background()
	// Until admitted, b, c and d count for nothing: not even a name.
	if _, err := admin.Join(ctx, "t", []string{"b"}); err == nil {
		t.Fatal("joined a pending node to a tribe")
	}
	if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{"b", "c", "d"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every node to see the admissions", func() bool {
		for _, n := range all {
			if n.pendingCount() != 0 {
				return false
			}
		}
		return true
	})
	if _, err := admin.CreateTribe(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Join(ctx, "t", []string{"b", "c"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "d to see tribe t", func() bool { _, ok := d.tribes()["t"]; return ok })
	// Only trusted writers load plugins; a built-in's bad config is
	// refused before anything is written. A plugin the writer does not
	// have may be one the members installed (external): it is written,
	// and each member that lacks it says so.
	if _, err := d.LoadPlugin(ctx, "echo", "t", api.LoadRequest{}); err == nil || !strings.Contains(err.Error(), "trusted writer") {
		t.Fatalf("untrusted load: %v", err)
	}
	if _, err := admin.LoadPlugin(ctx, "nosuch", "t", api.LoadRequest{}); err != nil {
		t.Fatalf("a plugin the writer lacks: %v", err)
	}
	waitFor(t, "b and c to say they lack it", func() bool {
		ps, _ := admin.Plugins(ctx, "t")
		lack := 0
		for _, p := range ps {
			for _, pn := range p.Nodes {
				if p.Name == "nosuch" && pn.State == "error" && strings.Contains(pn.Error, "unknown plugin") {
					lack++
				}
			}
		}
		return lack == 2
	})
	if _, err := admin.UnloadPlugin(ctx, "nosuch", "t"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.LoadPlugin(ctx, "echo", "t", api.LoadRequest{Config: map[string]string{"colour": "red"}}); err == nil || !strings.Contains(err.Error(), "colour") {
		t.Fatalf("bad config: %v", err)
	}
	if _, err := admin.LoadPlugin(ctx, "echo", "t", api.LoadRequest{Callers: []string{"everyone"}}); err == nil || !strings.Contains(err.Error(), "grant") {
		t.Fatalf("bad grant: %v", err)
	}
	if _, err := admin.LoadPlugin(ctx, "echo", "t", api.LoadRequest{Callers: []string{"members"}}); err != nil {
		t.Fatal(err)
	}
	// b loads it; c reports the load error instead of crashing.
	waitFor(t, "b loaded and c's error seen from d", func() bool {
		s := pluginStates(d, "t")
		return s["b"] == "loaded" && s["c"] == "error"
	})
	ps, _ := admin.Plugins(ctx, "t")
	for _, pn := range ps[0].Nodes {
		if pn.Name == "c" && !strings.Contains(pn.Error, "unknown plugin") {
			t.Fatalf("c's load error: %q", pn.Error)
		}
		if pn.Name == "b" && pn.Version != Version {
			t.Fatalf("b runs echo version %q, want the agent's %q", pn.Version, Version)
		}
	}

	echo := api.CallRequest{Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Args: json.RawMessage(`{"hi":1}`)}
	// The trusted admin is in no tribe and may call.
	got := call(t, admin, echo)
	if !got["b"].OK || string(got["b"].Result) != `{"hi":1}` || got["b"].Tribe != "t" {
		t.Fatalf("admin -> b: %+v", got["b"])
	}
	if got["c"].OK || got["c"].Code != string(plugins.CodeNotLoaded) {
		t.Fatalf("admin -> c: %+v, want not_loaded", got["c"])
	}
	// A member that is not trusted may call another member: the plugin's
	// entry grants its tribe's members.
	if got := call(t, c, api.CallRequest{Nodes: []string{"b"}, Plugin: "echo", Method: "echo"}); !got["b"].OK {
		t.Fatalf("member c -> b: %+v", got["b"])
	}
	// Admitted but neither trusted nor a member: refused, and counted on b.
	got = call(t, d, echo)
	if got["b"].OK || got["b"].Code != string(plugins.CodeUnauthorized) {
		t.Fatalf("stranger d -> b: %+v, want unauthorized", got["b"])
	}
	if st, _ := b.Status(ctx); st.Rejected["call_unauthorized"] != 1 {
		t.Fatalf("b's refusal counters: %v", st.Rejected)
	}
	// Unknown targets are the caller's error, before anything is sent.
	if _, err := admin.Call(ctx, api.CallRequest{Tribes: []string{"nope"}, Plugin: "echo", Method: "echo"}, func(api.CallResult) {}); err == nil {
		t.Fatal("call to an unknown tribe went ahead")
	}
	if _, err := admin.Call(ctx, api.CallRequest{Nodes: []string{"ghost"}, Plugin: "echo", Method: "echo"}, func(api.CallResult) {}); err == nil {
		t.Fatal("call to an unknown node went ahead")
	}

	// b leaves the tribe: it unloads, and a call to it says so.
	if _, err := admin.Leave(ctx, "t", []string{"b"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to unload echo", func() bool { _, ok := b.plugins.get("t", "echo"); return !ok })
	got = call(t, admin, api.CallRequest{Nodes: []string{"b"}, Plugin: "echo", Method: "echo"})
	if got["b"].Code != string(plugins.CodeNotLoaded) {
		t.Fatalf("call to a node that left: %+v", got["b"])
	}
	// Unloading clears c's error from its record.
	if _, err := admin.UnloadPlugin(ctx, "echo", "t"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "c to drop the failed load", func() bool { return c.plugins.status(c.registry.Source) == nil })
	if _, err := admin.UnloadPlugin(ctx, "echo", "t"); err == nil {
		t.Fatal("unloading twice succeeded")
	}
	// An entry a member cannot read is a load error it reports, not a
	// silent skip.
	if _, err := admin.replica.Put(ctx, pluginKey("t", "sys"), []byte("not json")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "c to report the unreadable entry", func() bool {
		return strings.Contains(c.plugins.status(c.registry.Source)["t/sys"].Error, "unreadable plugin entry")
	})
}

// garbler is an external plugin as pluginSet sees it: it counts the lines
// it wrote that broke its protocol.
type garbler struct {
	plugins.Plugin
	bad int64
}

func (g garbler) BadLines() int64 { return g.bad }

// plugin_bad_lines sums the external plugins' bad lines, and keeps those
// of a plugin unloaded: it never goes down.
func TestPluginBadLinesNeverGoDown(t *testing.T) {
	var s pluginSet
	s.loaded = map[string]*loadedPlugin{
		"t/a": {inst: &plugins.Instance{Plugin: garbler{bad: 3}}},
		"t/b": {inst: &plugins.Instance{Plugin: garbler{bad: 4}}},
		"t/c": {err: fmt.Errorf("did not load")},
	}
	if got := s.badLines(); got != 7 {
		t.Fatalf("%d bad lines, want 7", got)
	}
	s.mu.Lock()
	s.unloadLocked("t/a")
	s.mu.Unlock()
	if got := s.badLines(); got != 7 {
		t.Fatalf("%d bad lines once a plugin is unloaded, want 7", got)
	}
}
