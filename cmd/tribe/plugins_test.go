package main

import (
	"slices"
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

func TestNodesTableAndFilters(t *testing.T) {
	nodes := []api.Node{
		{ID: "12D3a", Name: "a", Addrs: []string{"/ip4/10.0.0.1/tcp/4001/p2p/12D3a", "/ip4/10.0.0.1/udp/4001/quic-v1/p2p/12D3a"}, Liveness: "alive", Admission: "admitted", Version: "1", Self: true,
			Facts: map[string]any{"os": "linux", "cpu_count": int64(8), "zip": "007"}},
		{ID: "12D3b", Name: "b", Liveness: "suspect", Admission: "pending", Version: "1"},
		{ID: "12D3c", Name: "c", Liveness: "dead", Admission: "admitted", Version: "1"},
	}
	var b strings.Builder
	if err := printNodes(&b, nodes[:1], true); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	if f := strings.Fields(lines[0]); !slices.Equal(f, []string{"NAME", "ID", "ADDRESS", "STATUS", "ADMISSION", "VERSION", "FACTS"}) {
		t.Errorf("header %q", lines[0])
	}
	if !strings.Contains(lines[1], "/ip4/10.0.0.1/tcp/4001 (+1)") || !strings.Contains(lines[1], "alive") ||
		!strings.HasSuffix(lines[1], "cpu_count=8,os=linux,zip=007") {
		t.Errorf("row %q", lines[1])
	}
	name := func(ns []api.Node) (out []string) {
		for _, n := range ns {
			out = append(out, n.Name)
		}
		return out
	}
	if got := name(filterNodes(slices.Clone(nodes), false, []string{"suspect", "dead"})); !slices.Equal(got, []string{"b", "c"}) {
		t.Errorf("--status suspect --status dead: %v", got)
	}
	if got := name(filterNodes(slices.Clone(nodes), true, []string{"dead"})); len(got) != 0 {
		t.Errorf("--pending --status dead: %v", got)
	}
	if _, stderr, code := runCLI("nodes", "--status", "gone"); code != 2 || !strings.Contains(stderr, `--status "gone": use alive, suspect, dead or left`) {
		t.Errorf("--status gone: exit %d %q", code, stderr)
	}
}
