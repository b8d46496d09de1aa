package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api"
)

// External plugins with real agents: admin (the trusted writer) and three
// members of tribe web that have the examples pyecho (Python) and hello
// (Go, the SDK) in their plugin dirs, installed by hand. Then admin shares
// a plugin none of them has, greet (the hello binary under another name),
// with web: w1 and w2 take shared plugins, w3 does not. Last, a tampered
// copy on w1 is refused by hash when w2 must fetch again and admin is down.
func TestExternalPluginsAcrossTheFleet(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed: the example plugin pyecho needs it")
	}
	bin := t.TempDir()
	hello := filepath.Join(bin, "hello")
	if out, err := exec.Command("go", "build", "-o", hello, "../../plugins/examples/hello").CombinedOutput(); err != nil {
		t.Fatalf("building the example plugin hello: %v\n%s", err, out)
	}
	helloBytes, _ := os.ReadFile(hello)
	pyecho, err := os.ReadFile("../../plugins/examples/pyecho/pyecho")
	if err != nil {
		t.Fatal(err)
	}

	admin := newAgent(t, "admin")
	adminID := presetIdentity(t, admin)
	admin.args = append(admin.args, "--trusted", adminID, "--auto-admit", "true")
	admin.start()
	seed := admin.tcpJoin()
	var members []*agentProc
	for _, name := range []string{"w1", "w2", "w3"} {
		extra := []string{"--join", seed, "--trusted", adminID}
		if name != "w3" {
			extra = append(extra, "--accept-plugins", "trusted")
		}
		w := newAgent(t, name, extra...)
		dir := filepath.Join(w.dir, "plugins")
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, "pyecho"), pyecho, 0o755)
		os.WriteFile(filepath.Join(dir, "hello"), helloBytes, 0o755)
		w.start()
		members = append(members, w)
	}
	w1, w2, w3 := members[0], members[1], members[2]
	waitUntil(t, 60*time.Second, "admin to admit the three", func() bool {
		var ns []api.Node
		admin.cliJSON(&ns, "nodes")
		admitted := 0
		for _, n := range ns {
			if n.Admission == "admitted" {
				admitted++
			}
		}
		return admitted == 3
	})
	admin.run(0, "create", "web")
	admin.run(0, "join", "web", "w1", "w2", "w3")
	admin.run(0, "plugin", "load", "pyecho", "--tribe", "web")
	admin.run(0, "plugin", "load", "hello", "--tribe", "web")
	waitUntil(t, 60*time.Second, "pyecho and hello loaded on the three", func() bool { return admin.loadedIn("web") == 6 })

	res, stderr, code := callLines(t, admin, "--tribe", "web", "pyecho", "count", `"three little words"`)
	if code != 0 || len(res) != 3 {
		t.Fatalf("pyecho count: exit %d, %v\n%s", code, res, stderr)
	}
	for _, w := range members {
		if r := res[w.name]; !r.OK || string(r.Result) != `{"words":3,"chars":18}` {
			t.Errorf("pyecho on %s: %+v", w.name, r)
		}
	}
	res, stderr, code = callLines(t, admin, "--tribe", "web", "hello", "greet", `{"name":"ada"}`)
	if code != 0 || len(res) != 3 {
		t.Fatalf("hello greet: exit %d, %v\n%s", code, res, stderr)
	}
	for _, w := range members {
		if r := res[w.name]; !r.OK || !strings.HasPrefix(string(r.Result), `"hello, ada, from `) {
			t.Errorf("hello on %s: %+v", w.name, r)
		}
	}

	// Sharing: greet is on no member; w1 and w2 take it, w3 says no.
	greet := filepath.Join(bin, "greet")
	os.WriteFile(greet, helloBytes, 0o755)
	out := admin.run(0, "plugin", "add", greet, "--tribe", "web")
	if !strings.Contains(out, "sharing greet") {
		t.Fatalf("plugin add: %s", out)
	}
	states := func() map[string]api.PluginNode {
		var ps []api.Plugin
		admin.cliJSON(&ps, "plugin", "list", "--tribe", "web")
		out := map[string]api.PluginNode{}
		for _, p := range ps {
			if p.Name == "greet" {
				for _, n := range p.Nodes {
					out[n.Name] = n
				}
			}
		}
		return out
	}
	waitUntil(t, 60*time.Second, "greet on w1 and w2, refused by w3", func() bool {
		s := states()
		return s["w1"].State == "loaded" && s["w2"].State == "loaded" && s["w3"].State == "error"
	})
	s := states()
	if !strings.HasPrefix(s["w1"].Source, "shared sha256:") || !strings.Contains(s["w3"].Error, "not installed here (sharing is off") {
		t.Errorf("greet: w1 %+v, w3 %+v", s["w1"], s["w3"])
	}
	res, _, _ = callLines(t, admin, "--tribe", "web", "greet", "echo", `[1,2]`)
	if !res["w1"].OK || !res["w2"].OK || res["w3"].OK || string(res["w1"].Result) != `[1,2]` {
		t.Fatalf("greet echo: %+v", res)
	}
	if _, err := os.Stat(filepath.Join(w3.dir, "plugins", "shared")); err == nil {
		t.Error("w3 keeps a shared store although it takes no shared plugins")
	}

	// A tampered copy: w1's bytes changed, w2's copy gone, admin down.
	// w2 must fetch from w1 at its restart: it refuses the bytes by hash.
	shared, _ := filepath.Glob(filepath.Join(w1.dir, "plugins", "shared", "*", "greet"))
	if len(shared) != 1 {
		t.Fatalf("w1's shared store: %v", shared)
	}
	tampered := append([]byte{}, helloBytes...)
	tampered[len(tampered)/2] ^= 0xff
	// Replaced, not written over: w1 runs that file (ETXTBSY).
	if err := os.WriteFile(shared[0]+".new", tampered, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(shared[0]+".new", shared[0]); err != nil {
		t.Fatal(err)
	}
	if err := admin.stop(); err != nil {
		t.Fatal(err)
	}
	if err := w2.stop(); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(w2.dir, "plugins", "shared"))
	w2.start()
	waitUntil(t, 60*time.Second, "w2 to refuse w1's tampered copy", func() bool {
		return w2.status().Rejected["plugin_hash_mismatch"] >= 1
	})
	waitUntil(t, 30*time.Second, "w2 to say why it has no greet", func() bool {
		var ps []api.Plugin
		w2.cliJSON(&ps, "plugin", "list", "--tribe", "web")
		for _, p := range ps {
			for _, n := range p.Nodes {
				if p.Name == "greet" && n.Name == "w2" {
					return n.State == "error" && strings.Contains(n.Error, "refused: its bytes hash to")
				}
			}
		}
		return false
	})
	if _, err := os.Stat(filepath.Join(w2.dir, "plugins", "shared")); err == nil {
		if found, _ := filepath.Glob(filepath.Join(w2.dir, "plugins", "shared", "*", "greet")); len(found) > 0 {
			t.Errorf("the tampered copy was installed on w2: %v", found)
		}
	}
}
