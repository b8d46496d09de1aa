package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api"
)

// members runs `tribe members T --json` against a and returns the member
// names, sorted.
func (a *agentProc) memberNames(tribe string) []string {
	a.t.Helper()
	var ms []api.Member
	a.cliJSON(&ms, "members", tribe)
	var names []string
	for _, m := range ms {
		names = append(names, m.Name)
	}
	slices.Sort(names)
	return names
}

func allAgree(tribe string, want []string, agents ...*agentProc) bool {
	for _, a := range agents {
		if !slices.Equal(a.memberNames(tribe), want) {
			return false
		}
	}
	return true
}

// A tribe created on one agent and joined from another agrees on every
// agent; an agent that was down while membership changed converges after
// it restarts.
func TestTribeStateConvergesAcrossAgents(t *testing.T) {
	a := newAgent(t, "n1")
	a.start()
	b := newAgent(t, "n2", "--join", a.tcpJoin())
	b.start()
	c := newAgent(t, "n3", "--join", a.tcpJoin())
	c.start()
	all := []*agentProc{a, b, c}
	waitUntil(t, 30*time.Second, "every agent to know all three nodes", func() bool {
		for _, x := range all {
			var nodes []api.Node
			x.cliJSON(&nodes, "nodes")
			if len(nodes) != 3 {
				return false
			}
		}
		return true
	})

	if out, stderr, code := tribe("create", "core", "--data-dir", a.dir); code != 0 {
		t.Fatalf("create: exit %d: %s%s", code, out, stderr)
	}
	waitUntil(t, 30*time.Second, "b to see tribe core", func() bool {
		_, _, code := tribe("show", "core", "--data-dir", b.dir)
		return code == 0
	})
	if out, stderr, code := tribe("join", "core", "n2", "n3", "--data-dir", b.dir); code != 0 {
		t.Fatalf("join: exit %d: %s%s", code, out, stderr)
	}
	want := []string{"n2", "n3"}
	waitUntil(t, 30*time.Second, "every agent to agree that core = n2, n3", func() bool { return allAgree("core", want, all...) })
	var ms []api.Member
	a.cliJSON(&ms, "members", "core")
	for _, m := range ms {
		if !m.Alive || !slices.Equal(m.Via, []string{"manual"}) || m.ID == "" {
			t.Fatalf("member %+v: want alive, via manual", m)
		}
	}

	// c is away while membership changes, then comes back.
	if err := c.stop(); err != nil {
		t.Fatalf("stop c: %v", err)
	}
	if out, stderr, code := tribe("leave", "core", "n3", "--data-dir", a.dir); code != 0 {
		t.Fatalf("leave: exit %d: %s%s", code, out, stderr)
	}
	if out, stderr, code := tribe("join", "core", "n1", "--data-dir", b.dir); code != 0 {
		t.Fatalf("join n1: exit %d: %s%s", code, out, stderr)
	}
	if _, _, code := tribe("create", "edge", "--data-dir", a.dir); code != 0 {
		t.Fatal("create edge")
	}
	c.start()
	want = []string{"n1", "n2"}
	waitUntil(t, 60*time.Second, "restarted n3 to converge", func() bool {
		var tribes []api.TribeSummary
		c.cliJSON(&tribes, "list")
		return allAgree("core", want, all...) && len(tribes) == 2
	})
	// The views agree before every entry is everywhere: c's record of
	// its restart may still be on its way.
	waitUntil(t, 30*time.Second, "every agent to hold the same state", func() bool {
		h := a.status().StateHash
		return h == b.status().StateHash && h == c.status().StateHash
	})
}

func TestTribeCommandErrors(t *testing.T) {
	a := newAgent(t, "solo")
	a.start()
	cases := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"show", "nope"}, 1, `unknown tribe "nope"`},
		{[]string{"members", "nope"}, 1, `unknown tribe "nope"`},
		{[]string{"join", "nope", "solo"}, 1, `unknown tribe "nope"`},
		{[]string{"create", "Bad Name"}, 1, "tribe name"},
		{[]string{"show"}, 2, "takes one argument"},
		{[]string{"join", "core"}, 2, "at least one node"},
	}
	for _, tc := range cases {
		_, stderr, code := tribe(append(tc.args, "--data-dir", a.dir)...)
		if code != tc.code || !strings.Contains(stderr, tc.msg) {
			t.Errorf("tribe %v: exit %d %q; want %d and %q", tc.args, code, stderr, tc.code, tc.msg)
		}
	}
	if _, _, code := tribe("create", "core", "--data-dir", a.dir); code != 0 {
		t.Fatal("create core")
	}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"create", "core"}, `tribe "core" exists`},
		{[]string{"join", "core", "ghost"}, `unknown node "ghost"`},
		{[]string{"join", "core", "12D3KooWJveGj4FtLxPTCvQzyzUweLC22uto2brEtE4pTkK6xNCj"}, "unknown node"},
		{[]string{"leave", "core", "solo"}, "not a manual member"},
	} {
		_, stderr, code := tribe(append(tc.args, "--data-dir", a.dir)...)
		if code != 1 || !strings.Contains(stderr, tc.msg) {
			t.Errorf("tribe %v: exit %d %q; want 1 and %q", tc.args, code, stderr, tc.msg)
		}
	}
}

// An agent with a trust list that does not name it cannot write tribe
// state, and says why.
func TestUntrustedAgentCannotCreateTribes(t *testing.T) {
	a := newAgent(t, "a", "--trusted", "12D3KooWJveGj4FtLxPTCvQzyzUweLC22uto2brEtE4pTkK6xNCj")
	a.start()
	_, stderr, code := tribe("create", "core", "--data-dir", a.dir)
	if code != 1 || !strings.Contains(stderr, "needs a trusted writer") {
		t.Fatalf("exit %d, %q", code, stderr)
	}
	if st := a.status(); st.Trust != "list" || len(st.Trusted) != 1 {
		t.Fatalf("status trust: %+v", st)
	}
}
