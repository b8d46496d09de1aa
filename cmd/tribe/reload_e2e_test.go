package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api"
)

// `tribe reload` and SIGHUP read the config file again: a new exec command
// runs at once, a setting that cannot change live is reported as needing a
// restart, and a file that does not parse is refused and changes nothing.
func TestReloadAndSIGHUPReadTheConfigFileAgain(t *testing.T) {
	a := newAgent(t, "n1")
	file := filepath.Join(a.dir, "agent.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("exec:\n  commands:\n    first: {argv: [echo, first]}\n")
	a.args = append(a.args, "--config", file)
	a.start()
	run := a.run
	run(0, "create", "core")
	run(0, "join", "core", "n1")
	run(0, "plugin", "load", "exec", "--tribe", "core")
	// The commands the exec plugin runs here, as a caller sees them.
	commands := func() []string {
		t.Helper()
		got, stderr, code := callLines(t, a, "--tribe", "core", "exec", "list")
		r, ok := got["n1"]
		if code != 0 || !ok || !r.OK {
			t.Fatalf("exec list: exit %d, %+v: %s", code, got, stderr)
		}
		var list []struct{ Name string }
		if err := json.Unmarshal(r.Result, &list); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, c := range list {
			names = append(names, c.Name)
		}
		return names
	}
	waitUntil(t, 30*time.Second, "exec to be loaded in core", func() bool {
		got, _, code := callLines(t, a, "--tribe", "core", "exec", "list")
		return code == 0 && got["n1"].OK
	})
	if got := commands(); !slices.Equal(got, []string{"first"}) {
		t.Fatalf("exec commands at start: %v", got)
	}

	write("exec:\n  commands:\n    second: {argv: [echo, second]}\ntarget_peers: 3\n")
	var res api.ReloadResult
	a.cliJSON(&res, "reload")
	if !slices.Equal(res.Changed, []string{"exec"}) || !slices.Equal(res.RestartNeeded, []string{"target_peers"}) {
		t.Errorf("reload: %+v, want exec changed and target_peers needing a restart", res)
	}
	if got := commands(); !slices.Equal(got, []string{"second"}) {
		t.Errorf("exec commands after tribe reload: %v", got)
	}
	got, _, _ := callLines(t, a, "--tribe", "core", "exec", "run", `{"command":"second"}`)
	if r := got["n1"]; !r.OK || !strings.Contains(string(r.Result), `"stdout":"second\n"`) {
		t.Errorf("running the new command: %+v", r)
	}
	if out := run(0, "reload"); !strings.Contains(out, "restart the agent to apply: target_peers") {
		t.Errorf("tribe reload's table: %q", out)
	}

	write("exec: [\n")
	if out := run(1, "reload"); !strings.Contains(out, "nothing changed") || !strings.Contains(out, file) {
		t.Errorf("reload of a file that does not parse: %q", out)
	}
	if got := commands(); !slices.Equal(got, []string{"second"}) {
		t.Errorf("exec commands after a refused reload: %v", got)
	}

	write("exec:\n  commands:\n    third: {argv: [echo, third]}\n")
	a.cmd.Process.Signal(syscall.SIGHUP)
	waitUntil(t, 30*time.Second, "SIGHUP to load the third command", func() bool {
		return slices.Equal(commands(), []string{"third"})
	})
	if !strings.Contains(a.log.String(), "configuration reloaded") {
		t.Errorf("the agent's log does not say it reloaded:\n%s", a.log)
	}
}
