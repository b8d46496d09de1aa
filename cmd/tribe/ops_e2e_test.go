package main

import (
	"strings"
	"testing"
)

// `tribe delete` removes a tribe with its plugins: it is gone from list
// and show, a second delete fails, and join needs `create` again. A tribe
// a policy names is refused, naming the policy.
func TestDeleteTribeWithPlugins(t *testing.T) {
	a := newAgent(t, "n1")
	a.start()
	run := func(want int, args ...string) string {
		t.Helper()
		out, stderr, code := tribe(append(args, "--data-dir", a.dir)...)
		if code != want {
			t.Fatalf("tribe %s: exit %d, want %d: %s%s", strings.Join(args, " "), code, want, out, stderr)
		}
		return out + stderr
	}
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
