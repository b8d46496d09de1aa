package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api"
)

// `tribe delete` removes a tribe with its plugins: it is gone from list
// and show, a second delete fails, and join needs `create` again. A tribe
// a policy names is refused, naming the policy.
func TestDeleteTribeWithPlugins(t *testing.T) {
	a := newAgent(t, "n1")
	a.start()
	run := a.run
	run(0, "create", "core")
	run(0, "join", "core", "n1")
	run(0, "plugin", "load", "echo", "--tribe", "core")
	if out := run(0, "delete", "core"); !strings.Contains(out, "deleted tribe core") {
		t.Fatalf("delete: %s", out)
	}
	if out := run(0, "list"); strings.Contains(out, "core") {
		t.Fatalf("list after delete: %s", out)
	}
	run(1, "show", "core")
	if out := run(1, "delete", "core"); !strings.Contains(out, `unknown tribe "core"`) {
		t.Fatalf("second delete: %s", out)
	}
	if out := run(1, "join", "core", "n1"); !strings.Contains(out, "tribe create core") {
		t.Fatalf("join after delete: %s", out)
	}

	run(0, "policy", "create", "all", "--tribe", "store", "true")
	if out := run(1, "delete", "store"); !strings.Contains(out, "policy all names it; delete the policy first") {
		t.Fatalf("delete of a tribe a policy names: %s", out)
	}
}

// nodeLiveness is n's liveness as a lists it ("" if not listed).
func (a *agentProc) nodeLiveness(name string) string {
	a.t.Helper()
	var nodes []api.Node
	a.cliJSON(&nodes, "nodes")
	for _, n := range nodes {
		if n.Name == name {
			return n.Liveness
		}
	}
	return ""
}

// An agent stopped by SIGTERM, or by `tribe leave`, is left on its peers
// (not suspect, then dead); `tribe leave` stops the agent; force-leave
// takes a node out of the views at once.
func TestLeaveAndForceLeave(t *testing.T) {
	a := newAgent(t, "n1")
	a.start()
	b := newAgent(t, "n2", "--join", a.tcpJoin())
	b.start()
	waitUntil(t, 30*time.Second, "n1 to see n2 alive", func() bool { return a.nodeLiveness("n2") == "alive" })
	if err := b.stop(); err != nil {
		t.Fatalf("stop n2: %v\n%s", err, b.log)
	}
	if got := a.nodeLiveness("n2"); got != "left" {
		t.Fatalf("n2 after SIGTERM: %q on n1, want left", got)
	}

	b.start()
	waitUntil(t, 30*time.Second, "n2 to be alive again", func() bool { return a.nodeLiveness("n2") == "alive" })
	if out, stderr, code := tribe("leave", "core", "--data-dir", b.dir); code != 2 || !strings.Contains(stderr, "leave takes no arguments") {
		t.Fatalf("leave with a tribe and no node: exit %d: %s%s", code, out, stderr)
	}
	out, stderr, code := tribe("leave", "--data-dir", b.dir)
	if code != 0 || !strings.Contains(out, "n2 left the cluster (1 peers acknowledged)") {
		t.Fatalf("tribe leave: exit %d: %s%s", code, out, stderr)
	}
	select {
	case <-b.done:
		b.cmd.ProcessState = &os.ProcessState{}
	case <-time.After(30 * time.Second):
		t.Fatalf("n2 did not stop after tribe leave\n%s", b.log)
	}
	if got := a.nodeLiveness("n2"); got != "left" {
		t.Fatalf("n2 after tribe leave: %q on n1, want left", got)
	}

	if out, stderr, code := tribe("force-leave", "n2", "--data-dir", a.dir); code != 0 || !strings.Contains(out, "force-left n2") {
		t.Fatalf("force-leave: exit %d: %s%s", code, out, stderr)
	}
	if got := a.nodeLiveness("n2"); got != "" {
		t.Fatalf("n2 after force-leave: %q on n1, want not listed", got)
	}
	if out, stderr, code := tribe("facts", "n2", "--data-dir", a.dir); code != 1 || !strings.Contains(stderr, "unknown node") {
		t.Fatalf("facts of a force-left node: exit %d: %s%s", code, out, stderr)
	}
}
