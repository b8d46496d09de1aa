package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/policy"
)

// policyTribes lists the tribes n is a member of by policy, in its state.
func policyTribes(n *Node) []string {
	var out []string
	for _, e := range n.replica.Prefix(tribesPrefix) {
		segs := strings.Split(e.Key, "/")
		if len(segs) == 5 && segs[2] == "members" && segs[3] == n.ID().String() && segs[4] == "policy" {
			out = append(out, segs[1])
		}
	}
	slices.Sort(out)
	return out
}

// selfMatches is whether `tribe policy test expr` lists n as a match.
func selfMatches(t *testing.T, n *Node, expr string) bool {
	t.Helper()
	ms, err := n.TestPolicy(context.Background(), expr)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.ID == n.ID().String() {
			return m.Match
		}
	}
	t.Fatalf("policy test does not list the node itself: %+v", ms)
	return false
}

// A facts file that cannot be taken whole (here, one that would make the
// node's record too large, then one that does not parse) is refused: the
// node keeps its old facts in its record, its policy memberships, policy
// test and its facts plugin, and counts the refusal. A good file then
// applies as usual.
func TestFactsAreAppliedAllOrNothing(t *testing.T) {
	ctx := context.Background()
	c := loopbackConfig(t, "a")
	c.FactsFile = filepath.Join(t.TempDir(), "facts.yaml")
	writeFacts := func(s string) {
		t.Helper()
		if err := os.WriteFile(c.FactsFile, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeFacts("tier: gold\n")
	n := startNodeDeps(t, c, Deps{Facts: func(context.Context) (policy.Facts, error) {
		return policy.Facts{"hostname": "a"}, nil
	}})
	for _, tier := range []string{"gold", "silver"} {
		if _, err := n.CreatePolicy(ctx, tier, tier, `facts.tier == "`+tier+`"`); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the node to join gold by policy", func() bool { return slices.Equal(policyTribes(n), []string{"gold"}) })

	keepsGold := func(when string) {
		t.Helper()
		if got := n.facts.get()["tier"]; got != "gold" {
			t.Errorf("%s: the node's facts (and facts plugin) say tier %v", when, got)
		}
		if f, err := n.Facts(ctx, ""); err != nil || f["tier"] != "gold" {
			t.Errorf("%s: the node's record says tier %v (%v)", when, f["tier"], err)
		}
		if !selfMatches(t, n, `facts.tier == "gold"`) || selfMatches(t, n, `facts.tier == "silver"`) {
			t.Errorf("%s: policy test no longer matches the node on gold only", when)
		}
		// What the policies make of the facts the node holds now.
		if err := n.reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		if got := policyTribes(n); !slices.Equal(got, []string{"gold"}) {
			t.Errorf("%s: policy memberships %v, want [gold]", when, got)
		}
	}

	writeFacts("tier: silver\nblob: " + strings.Repeat("x", 70<<10) + "\n")
	if err := n.RefreshFacts(ctx); !errors.Is(err, ErrFactsRefused) || !strings.Contains(err.Error(), "limit") {
		t.Errorf("facts too large for the record: %v", err)
	}
	keepsGold("after facts too large")

	writeFacts("tier: [silver\n")
	if err := n.RefreshFacts(ctx); !errors.Is(err, ErrFactsRefused) || !strings.Contains(err.Error(), c.FactsFile) {
		t.Errorf("facts file that does not parse: %v", err)
	}
	keepsGold("after a facts file that does not parse")
	if st, _ := n.Status(ctx); st.Rejected["facts_refused"] != 2 {
		t.Errorf("status counts %d refused facts, want 2", st.Rejected["facts_refused"])
	}

	writeFacts("tier: silver\n")
	if err := n.RefreshFacts(ctx); err != nil {
		t.Fatalf("good facts file: %v", err)
	}
	waitFor(t, "the node to move from gold to silver", func() bool { return slices.Equal(policyTribes(n), []string{"silver"}) })
	if f, _ := n.Facts(ctx, ""); f["tier"] != "silver" || !selfMatches(t, n, `facts.tier == "silver"`) {
		t.Fatalf("the record says tier %v after a good file", f["tier"])
	}
}

// A policy membership this node signed and then deleted, replayed once
// its tombstone was collected, is deleted again: the node says where it
// belongs, not whoever kept its old entry.
func TestReplayedOwnMembershipIsTakenBack(t *testing.T) {
	ctx := context.Background()
	var tier atomic.Value
	tier.Store("gold")
	n := startNodeDeps(t, loopbackConfig(t, "a"), Deps{Facts: func(context.Context) (policy.Facts, error) {
		return policy.Facts{"tier": tier.Load()}, nil
	}})
	for _, name := range []string{"gold", "silver"} {
		if _, err := n.CreatePolicy(ctx, name, name, `facts.tier == "`+name+`"`); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the node to join gold by policy", func() bool { return slices.Equal(policyTribes(n), []string{"gold"}) })
	key := memberKey("gold", n.ID(), "policy")
	old, _ := n.replica.Get(key)

	tier.Store("silver")
	if err := n.RefreshFacts(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the node to move to silver", func() bool { return slices.Equal(policyTribes(n), []string{"silver"}) })
	if err := n.replica.Forget(key); err != nil { // its tombstone, collected
		t.Fatal(err)
	}
	if err := n.replica.Apply(old); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replayed membership to be deleted again", func() bool {
		v, ok := n.replica.Version(key)
		return ok && v.Deleted && slices.Equal(policyTribes(n), []string{"silver"})
	})
}

// A rewrite of its memberships (announceOwn, on admission) that cannot
// write one of them (here, one tribe past gossip.MaxPolicyMemberships)
// writes the others once, not again and again: each write it makes of
// its own membership runs the reconcile again at once.
func TestRewriteWithAFailedMembershipDoesNotSpin(t *testing.T) {
	ctx := context.Background()
	n := startNodeDeps(t, loopbackConfig(t, "a"), Deps{Facts: func(context.Context) (policy.Facts, error) {
		return policy.Facts{"tier": "gold"}, nil
	}})
	if _, err := n.CreatePolicy(ctx, "gold", "gold", `facts.tier == "gold"`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the node to join gold by policy", func() bool { return slices.Equal(policyTribes(n), []string{"gold"}) })
	// Tribes left lately: their tombstones count towards the bound.
	for i := range gossip.MaxPolicyMemberships - 1 {
		if _, err := n.replica.Delete(ctx, memberKey(fmt.Sprintf("left%d", i), n.ID(), "policy")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.CreatePolicy(ctx, "extra", "extra", `facts.tier == "gold"`); err != nil {
		t.Fatal(err)
	}

	key := memberKey("gold", n.ID(), "policy")
	var writes atomic.Int64
	defer n.replica.Watch(key, func(gossip.Change) { writes.Add(1) })()
	n.announceOwn()
	waitFor(t, "gold to be written again", func() bool { return writes.Load() >= 1 })
	// Past the first retry (a second on), when a spinning loop would have
	// written it hundreds of times.
	time.Sleep(1500 * time.Millisecond)
	if got := writes.Load(); got > 2 {
		t.Fatalf("gold written %d times by one rewrite", got)
	}
	if got := policyTribes(n); !slices.Equal(got, []string{"gold"}) {
		t.Fatalf("policy memberships %v, want [gold]", got)
	}
}

// A node that more than maxClaimedPolicies policies put in one tribe
// names the first of them, as many as others take (checkValue).
func TestMembershipNamesAtMostMaxClaimedPolicies(t *testing.T) {
	ctx := context.Background()
	n := startNode(t, loopbackConfig(t, "a"))
	var names []string
	for i := range maxClaimedPolicies + 1 {
		name := fmt.Sprintf("p%02d", i)
		names = append(names, name)
		if _, err := n.CreatePolicy(ctx, name, "web", "true"); err != nil {
			t.Fatal(err)
		}
	}
	// One more, in a tribe after web: the reconcile that joins it saw
	// every policy for web, and wrote web first.
	if _, err := n.CreatePolicy(ctx, "zz", "zz", "true"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the node to join zz", func() bool { return slices.Contains(policyTribes(n), "zz") })
	e, _ := n.replica.Get(memberKey("web", n.ID(), "policy"))
	var rec memberRecord
	if err := json.Unmarshal(e.Value, &rec); err != nil || !slices.Equal(rec.Policies, names[:maxClaimedPolicies]) {
		t.Fatalf("membership %s (%v), want the first %d policies", e.Value, err, maxClaimedPolicies)
	}
	if err := checkValue(e); err != nil {
		t.Fatalf("others refuse it: %v", err)
	}
}

// An expression over every node's facts (policy test, nodes --where)
// stops when its client has left; nodes without a filter still lists.
func TestFactsFiltersStopWhenTheClientLeaves(t *testing.T) {
	n := startNode(t, loopbackConfig(t, "a"))
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := n.Nodes(gone, `facts.os != ""`); !errors.Is(err, context.Canceled) {
		t.Errorf("nodes --where for a client gone: %v", err)
	}
	if _, err := n.TestPolicy(gone, `facts.os != ""`); !errors.Is(err, context.Canceled) {
		t.Errorf("policy test for a client gone: %v", err)
	}
	if ns, err := n.Nodes(context.Background(), `true`); err != nil || len(ns) != 1 {
		t.Errorf("nodes --where true: %v, %v", ns, err)
	}
}

// policy test refuses exactly what policy create refuses, with the same
// message: both compile and type-check with policy.Compile.
func TestPolicyTestAndCreateRefuseAlike(t *testing.T) {
	ctx := context.Background()
	n := startNode(t, loopbackConfig(t, "a"))
	for _, expr := range []string{
		`1 + 1`, `facts.cpu_count + 1`, `"text"`, `facts.x ? 1 : 2`, `size(facts.x)`,
		`facts.x >`, `nosuch(facts.x)`, `facts.x > [1]`, ``,
		`facts.cpu_count > 1`, `facts.x`, // accepted by both: dyn may be a bool
	} {
		_, createErr := n.CreatePolicy(ctx, "p", "t", expr)
		_, testErr := n.TestPolicy(ctx, expr)
		if (createErr == nil) != (testErr == nil) || createErr != nil && createErr.Error() != testErr.Error() {
			t.Errorf("%q: create says %v, test says %v", expr, createErr, testErr)
		}
	}
}

// A policy entry this node cannot use (written by a trusted writer of
// another version, or by hand) matches nothing, is listed with why, and
// is counted once.
func TestUnusablePolicyIsListedAndCounted(t *testing.T) {
	ctx := context.Background()
	n := startNode(t, loopbackConfig(t, "a"))
	for name, v := range map[string]string{"broken": `{"tribe":"t","expr":"facts.os =="}`, "garbled": `not json`} {
		if _, err := n.replica.Put(ctx, policiesPrefix+name, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	n.policies()
	n.policies()
	ps, err := n.Policies(ctx)
	if err != nil || len(ps) != 2 {
		t.Fatalf("%+v %v", ps, err)
	}
	for _, p := range ps {
		if p.Error == "" {
			t.Errorf("%s: listed without its error", p.Name)
		}
	}
	if got := n.rejected()["policy_unusable"]; got != 2 {
		t.Errorf("policy_unusable %d, want 2 (once each)", got)
	}
}
