package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
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

// trustedAdmin starts the one trusted writer of a cluster; its config
// names it for the nodes that join (joinAdmin).
func trustedAdmin(t *testing.T) (*Node, Config) {
	t.Helper()
	ca := loopbackConfig(t, "admin")
	ca.Trusted = []string{identity(t, ca).String()}
	return startNode(t, ca), ca
}

// joinAdmin starts a node that trusts admin's writers and joins admin
// (pending until admitted), with tune, if set, applied to its config, and
// waits until admin holds its record.
func joinAdmin(t *testing.T, admin *Node, ca Config, name string, tune func(*Config)) *Node {
	t.Helper()
	c := loopbackConfig(t, name)
	c.Trusted, c.Join = ca.Trusted, []string{tcpAddr(admin)}
	if tune != nil {
		tune(&c)
	}
	n := startNode(t, c)
	waitFor(t, "admin to hold "+name+"'s record", func() bool { _, ok := admin.nodeNamed(n.ID()); return ok })
	return n
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
	if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{"b"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreatePolicy(ctx, "db", "core", `facts.role == "db"`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.LoadPlugin(ctx, "echo", "core", api.LoadRequest{Callers: []string{"members"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to load echo in core", func() bool { _, ok := b.plugins.get("core", "echo"); return ok })

	// evil's claims are signed with its key and handed to b as a peer's
	// entry is: evil's own agent, being honest code, deletes again a
	// membership of its own that its policies do not give it.
	var hlc gossip.HLC
	claim := func(policies ...string) {
		t.Helper()
		v, _ := json.Marshal(memberRecord{Policies: policies})
		hlc = gossip.Next(hlc, time.Now())
		e, err := gossip.Sign(gossip.Entry{Key: memberKey("core", evil.ID(), "policy"), Value: v, HLC: hlc}, evil.key)
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.replica.Accept(evil.ID(), e.Raw)
		if !b.rules().Counts(evil.ID()) {
			// Pending: b refuses the claim, counted, and holds nothing.
			if !errors.Is(err, gossip.ErrNotAdmitted) {
				t.Fatalf("b took a pending node's claim: %v", err)
			}
			if st, _ := b.Status(ctx); st.Rejected["not_admitted"] < 1 {
				t.Fatalf("b's counters: %v", st.Rejected)
			}
			if _, ok := b.replica.Get(memberKey("core", evil.ID(), "policy")); ok {
				t.Fatal("b holds a pending node's claim")
			}
			return
		}
		if err != nil {
			t.Fatalf("b refused an admitted node's claim: %v", err)
		}
		if err := b.replica.Apply(e); err != nil {
			t.Fatal(err)
		}
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
	if st, _ := b.Status(ctx); st.Rejected["call_unauthorized"] < 1 {
		t.Fatalf("b's counters: %v", st.Rejected)
	}
	if st, _ := evil.Status(ctx); st.Admission != "pending" {
		t.Fatalf("evil's own admission: %q", st.Admission)
	}
	// 2. Admitted: still a policy that does not exist.
	if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{"evil"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see evil admitted", func() bool { return b.rules().Status(evil.ID()) == authority.Admitted })
	// Admitted, evil writes its claim again, and b takes it now.
	claim("no-such-policy")
	refused("admitted, no such policy")
	if st, _ := b.Status(ctx); st.Rejected["membership_unbacked"] < 1 {
		t.Fatalf("b's counters: %v", st.Rejected)
	}
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
	if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{"b"}}); err != nil {
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
	if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{imp.ID().String()}}); err == nil || !strings.Contains(err.Error(), "held by node") {
		t.Fatalf("admitting a node under a live node's name: %v", err)
	}
	res, err := admin.Admit(ctx, api.AdmitRequest{AllPending: true})
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
	res, err = admin.Admit(ctx, api.AdmitRequest{AllPending: true})
	if err != nil || len(res) != 1 || peer.ID(res[0].ID) == b.ID() || res[0].ID != imp.ID().String() || res[0].Admission != "admitted" {
		t.Fatalf("--all-pending after revoking b: %+v, %v", res, err)
	}
	if s := admin.rules().Status(b.ID()); s != authority.Revoked {
		t.Fatalf("b is %s, want revoked", s)
	}
	// Only trusted writers admit; open trust has nothing to admit.
	if _, err := b.Admit(ctx, api.AdmitRequest{Nodes: []string{"b"}}); err == nil || !strings.Contains(err.Error(), "trusted writer") {
		t.Fatalf("admission by an untrusted node: %v", err)
	}
	open := startNode(t, loopbackConfig(t, "open"))
	if _, err := open.Admit(ctx, api.AdmitRequest{Nodes: []string{"open"}}); err == nil || !strings.Contains(err.Error(), "trust is open") {
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
	// A node whose facts match but whose name good holds stays pending.
	evals := admin.auth.autoAdmitEvals.Load()
	imp := start("good", policy.Facts{"fleet": "prod"})
	waitFor(t, "the impostor's record to be judged", func() bool { return admin.auth.autoAdmitEvals.Load() > evals })
	// other's record and the impostor's are evaluated once, not at every
	// pass.
	evals = admin.auth.autoAdmitEvals.Load()
	for range 25 { // 2.5 s: two passes at least
		select {
		case admin.admitCh <- struct{}{}:
		default:
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := admin.auth.autoAdmitEvals.Load(); got != evals {
		t.Errorf("%d evaluations more of records already judged", got-evals)
	}
	if s := admin.rules().Status(imp.ID()); s != authority.Pending {
		t.Fatalf("the impostor is %s, want pending", s)
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

// An admitted node that renames itself to another node's name gains
// nothing: names are bound at admission, and the holder keeps its name
// while it is down.
func TestAdmittedNodeCannotTakeAName(t *testing.T) {
	admin, ns := trustedCluster(t, nil, "db1", "evil")
	db1, evil := ns["db1"], ns["evil"]
	ctx := context.Background()
	if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{"db1", "evil"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateTribe(ctx, "secure"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "evil to see its admission", func() bool { return evil.rules().Status(evil.ID()) == authority.Admitted })
	evil.cfg.Name = "db1"
	if err := evil.publishSelf(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "admin to see the rename", func() bool { r, _ := admin.nodeNamed(evil.ID()); return r.Name == "db1" })
	// Counted by the records' watcher, just after the state holds the
	// record (the check right after the wait failed once under load).
	waitFor(t, "the claim counted", func() bool { st, _ := admin.Status(ctx); return st.Rejected["name_taken"] >= 1 })
	db1.Close()
	waitFor(t, "db1 to be gone", func() bool { return admin.liveness(db1.ID()) != Alive })
	ids, err := admin.resolve([]string{"db1"})
	if err != nil || ids[0] != db1.ID() {
		t.Fatalf("db1 resolves to %v, %v; want the node admitted as db1", ids, err)
	}
	if _, err := admin.Join(ctx, "secure", []string{"db1"}); err != nil {
		t.Fatal(err)
	}
	if admin.isMember("secure", evil.ID()) || !admin.isMember("secure", db1.ID()) {
		t.Fatal("tribe join secure db1 made the impostor a member")
	}
	// Re-admitting evil under the taken name is refused even while db1
	// is down; "evil" no longer answers to anything.
	if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{evil.ID().String()}}); err == nil || !strings.Contains(err.Error(), "held by node") {
		t.Fatalf("re-admitting evil as db1: %v", err)
	}
	if ids, err := admin.resolve([]string{"evil"}); err != nil || ids[0] != evil.ID() {
		t.Fatalf("evil still answers to its admitted name: %v, %v", ids, err)
	}
}

// Admission and revocation move a node's plugins and its right to serve
// calls with them, every time (the plugin loop sees the admission applied,
// whatever the watchers' order).
func TestRevocationUnloadsAndRefuses(t *testing.T) {
	admin, ns := trustedCluster(t, map[string]policy.Facts{"b": {"role": "db"}}, "b")
	b := ns["b"]
	ctx := context.Background()
	if _, err := admin.CreatePolicy(ctx, "db", "core", `facts.role == "db"`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.LoadPlugin(ctx, "echo", "core", api.LoadRequest{}); err != nil {
		t.Fatal(err)
	}
	id := b.ID().String()
	for round := range 3 {
		if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{id}}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "b to load echo", func() bool { _, ok := b.plugins.get("core", "echo"); return ok })
		if got := call(t, admin, api.CallRequest{Nodes: []string{id}, Plugin: "echo", Method: "echo"}); !got["b"].OK {
			t.Fatalf("round %d: admin -> admitted b: %+v", round, got["b"])
		}
		if _, err := admin.Revoke(ctx, []string{id}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "b to unload echo", func() bool { _, ok := b.plugins.get("core", "echo"); return !ok })
	}
	// Revoked, b's manual membership can still be removed (by peer ID: a
	// revoked node answers to no name).
	if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{id}}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Join(ctx, "core", []string{id}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Revoke(ctx, []string{id}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Leave(ctx, "core", []string{id}); err != nil {
		t.Fatalf("removing a revoked node's manual membership: %v", err)
	}
	if _, ok := admin.replica.Get(memberKey("core", b.ID(), "manual")); ok {
		t.Fatal("the manual membership is still there")
	}
}

// A pending node whose record would be over what peers take from a node
// that does not count withholds its facts until it is admitted: it is
// listed, can be admitted, and then writes them.
func TestLargeFactsWithheldUntilAdmitted(t *testing.T) {
	admin, ca := trustedAdmin(t)
	notes := strings.Repeat("n", gossip.MaxPendingRecord)
	big := joinAdmin(t, admin, ca, "big", func(c *Config) { c.Facts = policy.Facts{"notes": notes} })
	if f, _ := admin.Facts(context.Background(), big.ID().String()); f["notes"] != nil {
		t.Fatalf("a pending node's facts over the bound reached a peer: %d bytes", len(f["notes"].(string)))
	}
	if _, err := admin.Admit(context.Background(), api.AdmitRequest{Nodes: []string{"big"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "big's facts, once admitted", func() bool {
		f, _ := admin.Facts(context.Background(), big.ID().String())
		return f["notes"] == notes
	})
}

// A node that does not count writes its record again no sooner than peers
// take it (gossip.PendingRewrite after the last): a change comes late,
// not refused.
func TestPendingNodePacesItsRecord(t *testing.T) {
	admin, ca := trustedAdmin(t)
	b := joinAdmin(t, admin, ca, "b", nil)
	if _, err := b.adoptFacts(context.Background(), policy.Facts{"rack": "r2"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b's new facts on admin, gossip.PendingRewrite after its last record", func() bool {
		f, _ := admin.Facts(context.Background(), b.ID().String())
		return f["rack"] == "r2"
	})
	if got := admin.replica.Rejected()["pending_too_soon"]; got != 0 {
		t.Errorf("admin refused %d versions of b's record as too soon", got)
	}
}

// A claim is checked against its node's facts only where a policy for the
// tribe is to be run: a claim in a tribe no policy names, rewritten as
// often as its node likes, does not have its record (facts up to 64 KiB)
// decoded each time.
func TestPolicyBackingDecodesFactsOnlyToEvaluate(t *testing.T) {
	c := loopbackConfig(t, "big")
	tags := make([]any, 1000)
	for i := range tags {
		tags[i] = fmt.Sprintf("tag-%d", i)
	}
	c.Facts = policy.Facts{"role": "db", "tags": tags}
	n := startNode(t, c)
	waitFor(t, "its record", func() bool { _, ok := n.replica.Get(nodesPrefix + n.ID().String()); return ok })
	if _, err := n.CreatePolicy(context.Background(), "db", "core", `facts.role == "db"`); err != nil {
		t.Fatal(err)
	}
	claim := func(tribe string) *gossip.Signed {
		return &gossip.Signed{Entry: gossip.Entry{Key: memberKey(tribe, n.ID(), "policy"), Value: []byte(`{"policies":["db"]}`)}}
	}
	backing := func(tribe string, e *gossip.Signed) []string {
		n.auth.mu.Lock()
		clear(n.auth.backed) // as a new version of the claim or the record would
		n.auth.mu.Unlock()
		return n.policyBacking(tribe, n.ID(), e)
	}
	core, elsewhere := claim("core"), claim("elsewhere")
	if got := backing("core", core); !slices.Equal(got, []string{"db"}) {
		t.Fatalf("the claim in core is backed by %v, want [db]", got)
	}
	if got := backing("elsewhere", elsewhere); got != nil {
		t.Fatalf("the claim in a tribe db does not name is backed by %v", got)
	}
	if a := testing.AllocsPerRun(20, func() { backing("elsewhere", elsewhere) }); a > 100 {
		t.Errorf("%.0f allocations to find a claim in a tribe without policies unbacked: its facts were decoded", a)
	}
}
