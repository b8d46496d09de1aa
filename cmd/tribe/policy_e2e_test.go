package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api"
)

// Four agents, two with storage_tier=true. A policy created on a third
// puts the two in a tribe that did not exist, on every agent; one restarted
// with the fact changed leaves; a broken expression is refused with CEL's
// message and writes nothing.
func TestPolicyFormsATribeFromFacts(t *testing.T) {
	s1 := newAgent(t, "s1", "--fact", "storage_tier=true", "--fact", "rack=4")
	s1.start()
	seed := s1.tcpJoin()
	s2 := newAgent(t, "s2", "--join", seed, "--fact", "storage_tier=true")
	s2.start()
	p3 := newAgent(t, "p3", "--join", seed)
	p3.start()
	p4 := newAgent(t, "p4", "--join", seed, "--fact", "storage_tier=false")
	p4.start()
	all := []*agentProc{s1, s2, p3, p4}
	waitUntil(t, 30*time.Second, "every agent to know all four nodes", func() bool {
		for _, x := range all {
			var nodes []api.Node
			x.cliJSON(&nodes, "nodes")
			if len(nodes) != 4 {
				return false
			}
		}
		return true
	})

	// Facts are replicated: p3 sees s1's user facts, typed.
	var facts map[string]any
	p3.cliJSON(&facts, "facts", "s1")
	if facts["storage_tier"] != true || facts["rack"] != float64(4) || facts["hostname"] == nil {
		t.Fatalf("s1's facts seen from p3: %v", facts)
	}

	// A broken expression: exit 1, CEL's message, nothing written.
	_, stderr, code := tribe("policy", "create", "broken", "--tribe", "x", "facts.storage_tier ==", "--data-dir", p3.dir)
	if code != 1 || !strings.Contains(stderr, "Syntax error") {
		t.Fatalf("broken expression: exit %d, %q", code, stderr)
	}
	_, stderr, code = tribe("policy", "create", "nofn", "--tribe", "x", "nosuch(facts.a)", "--data-dir", p3.dir)
	if code != 1 || !strings.Contains(stderr, "undeclared reference") {
		t.Fatalf("unknown function: exit %d, %q", code, stderr)
	}
	var policies []api.Policy
	p3.cliJSON(&policies, "policy", "list")
	if len(policies) != 0 {
		t.Fatalf("a refused policy was written: %v", policies)
	}

	if out, stderr, code := tribe("policy", "create", "storage", "--tribe", "storage", "facts.storage_tier == true", "--data-dir", p3.dir); code != 0 {
		t.Fatalf("policy create: exit %d: %s%s", code, out, stderr)
	}
	want := []string{"s1", "s2"}
	waitUntil(t, 30*time.Second, "s1 and s2 in tribe storage on every agent", func() bool { return allAgree("storage", want, all...) })
	var tr api.Tribe
	s2.cliJSON(&tr, "show", "storage")
	if !slices.Equal(tr.Policies, []string{"storage"}) || tr.Explicit {
		t.Fatalf("tribe storage: %+v", tr)
	}
	for _, m := range tr.Members {
		if !slices.Equal(m.Via, []string{"storage"}) {
			t.Fatalf("member %s via %v, want the policy", m.Name, m.Via)
		}
	}
	var matches []api.Match
	p4.cliJSON(&matches, "policy", "test", "facts.storage_tier == true")
	matched := 0
	for _, m := range matches {
		if m.Match {
			matched++
		}
		if m.Name == "p3" && !strings.Contains(m.Error, "missing fact") {
			t.Errorf("p3 has no storage_tier fact; test should say so: %+v", m)
		}
	}
	if matched != 2 {
		t.Fatalf("policy test: %+v", matches)
	}
	var nodes []api.Node
	p4.cliJSON(&nodes, "nodes", "--where", "facts.storage_tier == true")
	if len(nodes) != 2 {
		t.Fatalf("nodes --where: %+v", nodes)
	}

	// s2 comes back without the fact: it leaves, everywhere.
	if err := s2.stop(); err != nil {
		t.Fatal(err)
	}
	s2.args = withoutFlag(s2.args, "--fact")
	s2.args = append(s2.args, "--fact", "storage_tier=false")
	s2.start()
	waitUntil(t, 30*time.Second, "s2 to leave storage on every agent", func() bool { return allAgree("storage", []string{"s1"}, all...) })

	// Deleting the policy empties the tribe, which then no longer exists.
	if _, _, code := tribe("policy", "delete", "storage", "--data-dir", s1.dir); code != 0 {
		t.Fatal("policy delete")
	}
	waitUntil(t, 30*time.Second, "tribe storage to disappear", func() bool {
		for _, x := range all {
			if _, _, code := tribe("show", "storage", "--data-dir", x.dir); code == 0 {
				return false
			}
		}
		return true
	})
}

// SIGHUP re-reads the facts file: a host whose file changes joins the
// tribe its policy names, without a restart.
func TestSIGHUPRereadsFactsFile(t *testing.T) {
	facts := filepath.Join(t.TempDir(), "facts.yaml")
	if err := os.WriteFile(facts, []byte("storage_tier: false\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := newAgent(t, "h1", "--facts-file", facts)
	a.start()
	if _, stderr, code := tribe("policy", "create", "storage", "--tribe", "storage", "facts.storage_tier == true", "--data-dir", a.dir); code != 0 {
		t.Fatalf("policy create: %s", stderr)
	}
	if err := os.WriteFile(facts, []byte("storage_tier: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a.cmd.Process.Signal(syscall.SIGHUP)
	waitUntil(t, 30*time.Second, "h1 to join storage after SIGHUP", func() bool {
		_, _, code := tribe("show", "storage", "--data-dir", a.dir)
		if code != 0 {
			return false
		}
		var tr api.Tribe
		a.cliJSON(&tr, "show", "storage")
		return len(tr.Members) == 1 && tr.Members[0].Name == "h1"
	})
	var f map[string]any
	a.cliJSON(&f, "facts")
	if f["storage_tier"] != true {
		t.Fatalf("facts after SIGHUP: %v", f["storage_tier"])
	}
}

// A SIGHUP that comes while the agent starts does not end it (systemd
// would count that a clean exit, and not restart it): it is one reload
// once the agent is ready.
func TestSIGHUPWhileStarting(t *testing.T) {
	a := newAgent(t, "h1")
	a.launch(exec.Command(tribeBin, a.args...))
	waitEvery(t, 30*time.Second, time.Millisecond, "the agent's first log line", func() bool {
		return strings.Contains(a.log.String(), "created a new identity")
	})
	a.cmd.Process.Signal(syscall.SIGHUP)
	waitEvery(t, 30*time.Second, 5*time.Millisecond, "the agent to be ready", func() bool {
		select {
		case err := <-a.done:
			t.Fatalf("the agent ended on a SIGHUP while starting: %v\n%s", err, a.log)
		default:
		}
		_, err := api.NewClient(filepath.Join(a.dir, api.SocketName)).Status(context.Background())
		return err == nil
	})
}
