package node

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip/authority"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/policy"
)

// trustedCluster starts admin (the one trusted writer) and nodes that
// join it, each with its own facts.
func trustedCluster(t *testing.T, facts map[string]policy.Facts, names ...string) (*Node, map[string]*Node) {
	t.Helper()
	ca := loopbackConfig(t, "admin")
	ca.Trusted = []string{identity(t, ca).String()}
	admin := startNode(t, ca)
	out := map[string]*Node{}
	for _, name := range names {
		c := loopbackConfig(t, name)
		c.Trusted, c.Join, c.Facts = ca.Trusted, []string{tcpAddr(admin)}, facts[name]
		out[name] = startNode(t, c)
	}
	waitFor(t, "every node to know every other", func() bool {
		if len(admin.nodeRecords()) != len(names)+1 {
			return false
		}
		for _, n := range out {
			if len(n.nodeRecords()) != len(names)+1 {
				return false
			}
		}
		return true
	})
	return admin, out
}

func memberNames(t *testing.T, n *Node, tribe string) []string {
	t.Helper()
	v, ok := n.tribes()[tribe]
	if !ok {
		return nil
	}
	var out []string
	for _, m := range n.members(v) {
		out = append(out, m.Name)
	}
	return out
}

// The attack issue 13 found: a peer with a fresh identity writes the one
// kind of entry it may sign, a policy membership of its own, naming a
// policy that does not exist, and from then on was a member of the tribe
// that every member accepted calls from. Now it gains nothing, before or
// after admission, and every member counts the attempt.
func TestSelfDeclaredMembershipGainsNothing(t *testing.T) {
	admin, ns := trustedCluster(t, map[string]policy.Facts{
		"b":    {"role": "db"},
		"evil": {"role": "web"},
	}, "b", "evil")
	b, evil := ns["b"], ns["evil"]
	ctx := context.Background()
	if _, err := admin.Admit(ctx, []string{"b"}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreatePolicy(ctx, "db", "core", `facts.role == "db"`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.LoadPlugin(ctx, "echo", "core", api.LoadRequest{Callers: []string{"members"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to load echo in core", func() bool { _, ok := b.plugins.get("core", "echo"); return ok })

	claim := func(policies ...string) {
		t.Helper()
		v, _ := json.Marshal(memberRecord{Policies: policies})
		if _, err := evil.replica.Put(ctx, memberKey("core", evil.ID(), "policy"), v); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "b to store the claim", func() bool {
			e, ok := b.replica.Get(memberKey("core", evil.ID(), "policy"))
			return ok && string(e.Value) == string(v)
		})
	}
	refused := func(stage string) {
		t.Helper()
		for _, n := range []*Node{admin, b} {
			if got := memberNames(t, n, "core"); !slices.Equal(got, []string{"b"}) {
				t.Fatalf("%s: %s lists core's members as %v", stage, n.cfg.Name, got)
			}
			if slices.Contains(n.tribeMembers("core"), evil.ID()) {
				t.Fatalf("%s: %s would send a fan-out to evil", stage, n.cfg.Name)
			}
		}
		got := call(t, evil, api.CallRequest{Nodes: []string{b.ID().String()}, Plugin: "echo", Method: "echo"})
		for _, r := range got {
			if r.OK || r.Code != string(plugins.CodeUnauthorized) {
				t.Fatalf("%s: evil -> b: %+v, want unauthorized", stage, r)
			}
		}
		// evil runs nothing of core's either: its membership does not
		// count on its own node.
		if _, ok := evil.plugins.get("core", "echo"); ok {
			t.Fatalf("%s: evil loaded core's plugins", stage)
		}
	}

	// 1. Pending, claiming a policy that does not exist.
	claim("no-such-policy")
	refused("pending, no such policy")
	if st, _ := b.Status(ctx); st.Rejected["membership_unbacked"] < 1 || st.Rejected["call_unauthorized"] < 1 {
		t.Fatalf("b's counters: %v", st.Rejected)
	}
	if st, _ := evil.Status(ctx); st.Admission != "pending" {
		t.Fatalf("evil's own admission: %q", st.Admission)
	}
	// 2. Admitted: still a policy that does not exist.
	if _, err := admin.Admit(ctx, []string{"evil"}, false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see evil admitted", func() bool { return b.rules().Status(evil.ID()) == authority.Admitted })
	refused("admitted, no such policy")
	// 3. A policy that exists and names the tribe, but evil's replicated
	// facts do not match it.
	claim("db")
	refused("admitted, facts do not match")
	// 4. A policy of another tribe.
	if _, err := admin.CreatePolicy(ctx, "web", "edge", `facts.role == "web"`); err != nil {
		t.Fatal(err)
	}
	// evil's own reconciler, seeing the new policy, drops memberships no
	// policy gives it: let it finish before the claim.
	waitFor(t, "evil to join edge by policy", func() bool { return evil.isMember("edge", evil.ID()) })
	claim("web")
	refused("admitted, another tribe's policy")

	// And a node that really matches counts: the control case.
	waitFor(t, "b to count in core by policy", func() bool {
		return slices.Equal(memberNames(t, evil, "core"), []string{"b"})
	})
	if got := call(t, b, api.CallRequest{Tribes: []string{"core"}, Plugin: "echo", Method: "echo"}); !got["b"].OK {
		t.Fatalf("b -> itself as a member: %+v", got["b"])
	}
}

// A pending node cannot take an admitted node's name, nor be admitted
// under it; revocation is sticky against --all-pending.
func TestNamesAndRevocation(t *testing.T) {
	admin, ns := trustedCluster(t, nil, "b")
	b := ns["b"]
	ctx := context.Background()
	if _, err := admin.Admit(ctx, []string{"b"}, false); err != nil {
		t.Fatal(err)
	}
	// An impostor calls itself b.
	c := loopbackConfig(t, "b")
	c.Trusted, c.Join = admin.cfg.Trusted, []string{tcpAddr(admin)}
	imp := startNode(t, c)
	waitFor(t, "admin to see the impostor", func() bool { return len(admin.nodeRecords()) == 3 })
	ids, err := admin.resolve([]string{"b"})
	if err != nil || ids[0] != b.ID() {
		t.Fatalf("resolve b = %v, %v; want the admitted b", ids, err)
	}
	if _, err := admin.Admit(ctx, []string{imp.ID().String()}, false); err == nil || !strings.Contains(err.Error(), "held by live node") {
		t.Fatalf("admitting a node under a live node's name: %v", err)
	}
	res, err := admin.Admit(ctx, nil, true)
	if err != nil || len(res) != 1 || res[0].Admission != "pending" || res[0].Error == "" {
		t.Fatalf("--all-pending with the impostor: %+v, %v", res, err)
	}
	// Revoked b is no longer a holder: its name resolves to nobody that
	// counts, and --all-pending does not bring b back.
	if _, err := admin.Revoke(ctx, []string{b.ID().String()}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.resolve([]string{"b"}); err == nil {
		t.Fatal("a revoked node's name still resolves")
	}
	res, err = admin.Admit(ctx, nil, true)
	if err != nil || len(res) != 1 || peer.ID(res[0].ID) == b.ID() || res[0].ID != imp.ID().String() || res[0].Admission != "admitted" {
		t.Fatalf("--all-pending after revoking b: %+v, %v", res, err)
	}
	if s := admin.rules().Status(b.ID()); s != authority.Revoked {
		t.Fatalf("b is %s, want revoked", s)
	}
	// Only trusted writers admit; open trust has nothing to admit.
	if _, err := b.Admit(ctx, []string{"b"}, false); err == nil || !strings.Contains(err.Error(), "trusted writer") {
		t.Fatalf("admission by an untrusted node: %v", err)
	}
	open := startNode(t, loopbackConfig(t, "open"))
	if _, err := open.Admit(ctx, []string{"open"}, false); err == nil || !strings.Contains(err.Error(), "trust is open") {
		t.Fatalf("admission under open trust: %v", err)
	}
}

// --auto-admit on a trusted writer admits the pending nodes whose facts
// match, and only those.
func TestAutoAdmit(t *testing.T) {
	ca := loopbackConfig(t, "admin")
	ca.Trusted = []string{identity(t, ca).String()}
	ca.AutoAdmit = `facts.fleet == "prod"`
	admin := startNode(t, ca)
	start := func(name string, facts policy.Facts) *Node {
		c := loopbackConfig(t, name)
		c.Trusted, c.Join, c.Facts = ca.Trusted, []string{tcpAddr(admin)}, facts
		return startNode(t, c)
	}
	good := start("good", policy.Facts{"fleet": "prod"})
	other := start("other", policy.Facts{"fleet": "lab"})
	waitFor(t, "good to be admitted", func() bool { return admin.rules().Status(good.ID()) == authority.Admitted })
	waitFor(t, "good to see its own admission", func() bool { return good.rules().Status(good.ID()) == authority.Admitted })
	if s := admin.rules().Status(other.ID()); s != authority.Pending {
		t.Fatalf("other is %s, want pending", s)
	}
	bad := loopbackConfig(t, "x")
	bad.AutoAdmit = "facts.fleet =="
	bad.Trusted = ca.Trusted
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "auto-admit") {
		t.Fatalf("a broken auto-admit expression: %v", err)
	}
	bad.Trusted, bad.AutoAdmit = nil, "true"
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "trusted") {
		t.Fatalf("auto-admit with open trust: %v", err)
	}
}
