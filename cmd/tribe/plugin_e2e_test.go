package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/node/api"
)

// presetIdentity creates the agent's key before it starts (tribe id), so its peer ID
// can go in every agent's trust list.
func presetIdentity(t testing.TB, a *agentProc) string {
	t.Helper()
	out, stderr, code := tribe("id", "--data-dir", a.dir)
	if code != 0 {
		t.Fatalf("tribe id: exit %d %s", code, stderr)
	}
	id := strings.TrimSpace(out)
	if _, err := peer.Decode(id); err != nil {
		t.Fatalf("tribe id printed %q: %v", out, err)
	}
	return id
}

// loadedIn counts the plugin loads in tribe that a says are loaded.
func (a *agentProc) loadedIn(tribe string) int {
	a.t.Helper()
	var ps []api.Plugin
	a.cliJSON(&ps, "plugin", "list", "--tribe", tribe)
	loaded := 0
	for _, p := range ps {
		for _, n := range p.Nodes {
			if n.State == "loaded" {
				loaded++
			}
		}
	}
	return loaded
}

// callLines runs `tribe call ... --json` and returns each node's result by
// name, and the exit code.
func callLines(t testing.TB, from *agentProc, args ...string) (map[string]api.CallResult, string, int) {
	t.Helper()
	stdout, stderr, code := tribe(append([]string{"call", "--data-dir", from.dir, "--json"}, args...)...)
	out := map[string]api.CallResult{}
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		var r api.CallResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("call output line %q: %v", sc.Text(), err)
		}
		out[r.Name] = r
	}
	return out, stderr, code
}

// Six agents: admin (the trusted writer, in no tribe), three storage hosts
// that a policy puts in tribe storage, and two others that are admitted
// but neither trusted nor members.
func TestCallExecOnATribe(t *testing.T) {
	admin := newAgent(t, "admin")
	adminID := presetIdentity(t, admin)
	admin.args = append(admin.args, "--trusted", adminID)
	admin.start()
	seed := admin.tcpJoin()
	// Each host defines "uptime" in its own config: uptime(1) where procps
	// is installed, else the kernel's own counter.
	uptimeCmd, uptimeSays := "uptime=uptime", "load average"
	if _, err := exec.LookPath("uptime"); err != nil {
		uptimeCmd, uptimeSays = "uptime=cat /proc/uptime", "."
	}
	marks := t.TempDir()
	var storage []*agentProc
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("s%d", i)
		// The slow command says when it started, so the test can kill a
		// member mid-call without guessing.
		cfg := filepath.Join(t.TempDir(), "agent.yaml")
		os.WriteFile(cfg, []byte(fmt.Sprintf(`exec:
  commands:
    slow:
      argv: ["sh", "-c", "touch %s/%s; sleep 3; echo done"]
`, marks, name)), 0o600)
		storage = append(storage, newAgent(t, name, "--join", seed, "--trusted", adminID, "--config", cfg,
			"--fact", "storage_tier=true", "--exec", uptimeCmd))
	}
	o4 := newAgent(t, "o4", "--join", seed, "--trusted", adminID, "--exec", uptimeCmd)
	o5 := newAgent(t, "o5", "--join", seed, "--trusted", adminID)
	all := append([]*agentProc{admin, o4, o5}, storage...)
	for _, a := range all[1:] {
		a.start()
	}
	// The trusted writer admits the five (with a trust list nobody else
	// counts until then).
	waitUntil(t, 60*time.Second, "admin to see five pending agents", func() bool {
		var ns []api.Node
		admin.cliJSON(&ns, "nodes", "--pending")
		return len(ns) == 5
	})
	if out, stderr, code := tribe("admit", "--all-pending", "--data-dir", admin.dir); code != 0 || strings.Count(out, "admitted") != 5 {
		t.Fatalf("admit --all-pending: exit %d\n%s%s", code, out, stderr)
	}
	if _, stderr, code := tribe("policy", "create", "storage", "--tribe", "storage", "facts.storage_tier == true", "--data-dir", admin.dir); code != 0 {
		t.Fatalf("policy create: %s", stderr)
	}
	waitUntil(t, 60*time.Second, "tribe storage with the three storage hosts", func() bool {
		var tr api.Tribe
		_, _, code := tribe("show", "storage", "--data-dir", admin.dir)
		if code != 0 {
			return false
		}
		admin.cliJSON(&tr, "show", "storage")
		return len(tr.Members) == 3
	})

	// Loading is for trusted writers, checked before anything is written.
	if _, stderr, code := tribe("plugin", "load", "exec", "--tribe", "storage", "--data-dir", o4.dir); code != 1 || !strings.Contains(stderr, "trusted writer") {
		t.Fatalf("untrusted load: exit %d %q", code, stderr)
	}
	if _, stderr, code := tribe("plugin", "load", "exec", "--tribe", "storage", "--config", "colour=red", "--data-dir", admin.dir); code != 1 || !strings.Contains(stderr, "colour") {
		t.Fatalf("a built-in's unknown config key: exit %d %q", code, stderr)
	}
	if _, stderr, code := tribe("plugin", "load", "exec", "--tribe", "storage", "--data-dir", admin.dir); code != 0 {
		t.Fatalf("plugin load: %s", stderr)
	}
	waitUntil(t, 30*time.Second, "exec loaded on the three members, as o5 sees it", func() bool {
		return o5.loadedIn("storage") == 3
	})

	// The trusted admin, outside the tribe, gets three answers.
	got, stderr, code := callLines(t, admin, "--tribe", "storage", "exec", "run", `{"command":"uptime"}`)
	if code != 0 || len(got) != 3 {
		t.Fatalf("call from admin: exit %d, %d results: %v\n%s", code, len(got), got, stderr)
	}
	for _, s := range storage {
		var res struct {
			Stdout   string `json:"stdout"`
			ExitCode int    `json:"exit_code"`
		}
		r := got[s.name]
		json.Unmarshal(r.Result, &res)
		if !r.OK || r.Tribe != "storage" || !strings.Contains(res.Stdout, uptimeSays) {
			t.Fatalf("%s answered %+v", s.name, r)
		}
	}
	if !strings.Contains(stderr, `"answered":3`) {
		t.Fatalf("summary: %q", stderr)
	}
	// The human form ends with the summary.
	if out, _, code := tribe("call", "--tribe", "storage", "exec", "run", `{"command":"uptime"}`, "--data-dir", admin.dir); code != 0 || !strings.Contains(out, "3 nodes: 3 answered, 0 failed, 0 timed out") {
		t.Fatalf("human call output (exit %d):\n%s", code, out)
	}

	// An admitted, untrusted non-member is refused by every member, exit 1.
	got, _, code = callLines(t, o4, "--tribe", "storage", "exec", "run", `{"command":"uptime"}`)
	if code != 1 || len(got) != 3 {
		t.Fatalf("call from o4: exit %d, %v", code, got)
	}
	for name, r := range got {
		if r.OK || r.Code != "unauthorized" {
			t.Fatalf("%s let an untrusted non-member call: %+v", name, r)
		}
	}
	// Commands the host does not define are refused there.
	got, _, code = callLines(t, admin, "--node", "s1", "exec", "run", `{"argv":["id"]}`)
	if code != 1 || got["s1"].Code != "unauthorized" {
		t.Fatalf("arbitrary argv: exit %d %+v", code, got["s1"])
	}

	// A member killed mid-call is reported, not waited for until the
	// timeout: the others answer, it is "gone".
	call := exec.Command(tribeBin, "call", "--data-dir", admin.dir, "--json", "--timeout", "2m", "--tribe", "storage", "exec", "run", `{"command":"slow"}`)
	var out strings.Builder
	call.Stdout = &out
	if err := call.Start(); err != nil {
		t.Fatal(err)
	}
	waitEvery(t, 30*time.Second, 10*time.Millisecond, "s3's slow command to start", func() bool {
		_, err := os.Stat(filepath.Join(marks, "s3"))
		return err == nil
	})
	storage[2].kill()
	err := call.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("call with a killed member: %v\n%s", err, out.String())
	}
	got = map[string]api.CallResult{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var r api.CallResult
		json.Unmarshal([]byte(line), &r)
		got[r.Name] = r
	}
	if !got["s1"].OK || !got["s2"].OK || got["s3"].OK || got["s3"].Code != "gone" {
		t.Fatalf("after killing s3 mid-call: %+v", got)
	}
}

func TestCallAndPluginUsageErrors(t *testing.T) {
	dir := shortTempDir(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"call", "echo", "echo"}, "--tribe T or --node N"},
		{[]string{"call", "--node", "a", "echo"}, "PLUGIN METHOD [JSON]"},
		{[]string{"call", "--node", "a", "echo", "echo", "{bad"}, "not valid JSON"},
		{[]string{"call", "--node", "a", "--timeout", "soon", "echo", "echo"}, "timeout"},
		{[]string{"plugin", "load", "--tribe", "t"}, "one plugin name"},
		{[]string{"plugin", "load", "echo"}, "tribe"},
		{[]string{"plugin", "load", "echo", "--tribe", "t", "--config", "novalue"}, "key=value"},
		{[]string{"plugin", "unload", "echo"}, "tribe"},
		{[]string{"agent", "--exec", "nocommand"}, "NAME=COMMAND"},
	} {
		_, stderr, code := tribe(append(c.args, "--data-dir", dir)...)
		if code != 2 || !strings.Contains(stderr, c.want) || !strings.HasPrefix(stderr, "tribe: ") {
			t.Errorf("tribe %v: exit %d, %q; want exit 2 mentioning %q", c.args, code, stderr, c.want)
		}
	}
	// With no agent running, a well-formed call says so and exits 1.
	// The table's header waits for a first result: nothing goes to stdout.
	stdout, stderr, code := tribe("call", "--node", "a", "echo", "echo", "--data-dir", dir)
	if code != 1 || !strings.Contains(stderr, "no agent running") || stdout != "" {
		t.Fatalf("call without an agent: exit %d, %q, stdout %q", code, stderr, stdout)
	}
}
