package main

import (
	"strings"
	"testing"

	"github.com/tribeagent/tribe/node/api"
)

func TestCallTableRowsStayOneLineEach(t *testing.T) {
	var b strings.Builder
	tbl := callTable{w: &b}
	tbl.row(api.CallResult{Name: "a", OK: true, Result: []byte(`{"x": 1}`)})
	tbl.row(api.CallResult{Name: "b", Code: "unreachable", Error: "failed to dial:\n  * [/ip4/10.0.0.1/tcp/4001] dial tcp: refused\n  * [/ip4/10.0.0.2/tcp/4001] timeout"})
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NODE") || !strings.HasPrefix(lines[1], "a ") || !strings.HasPrefix(lines[2], "b ") {
		t.Fatalf("want a header and one line per node, got:\n%s", b.String())
	}
	if !strings.HasSuffix(lines[2], "failed to dial: * [/ip4/10.0.0.1/tcp/4001] dial tcp: refused * [/ip4/10.0.0.2/tcp/4001] timeout") {
		t.Errorf("error row %q", lines[2])
	}
}

func TestPlural(t *testing.T) {
	for n, want := range map[int]string{0: "0 nodes", 1: "1 node", 2: "2 nodes"} {
		if got := plural(n, "node"); got != want {
			t.Errorf("plural(%d) = %q, want %q", n, got, want)
		}
	}
}
