package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/policy"
)

// randomFacts gives node i seeded facts: some have storage_tier, racks
// 0-9, random memory, a few GPUs, some CPU features.
func randomFacts(seed uint64) func(i int) policy.Facts {
	return func(i int) policy.Facts {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		f := policy.Facts{
			"hostname":    fmt.Sprintf("n%d", i),
			"rack":        int64(rng.IntN(10)),
			"memtotal_mb": int64(1024 * (1 + rng.IntN(64))),
			"os_dist":     []string{"ubuntu", "debian", "rocky"}[rng.IntN(3)],
		}
		if rng.IntN(3) == 0 {
			f["storage_tier"] = true
		}
		if rng.IntN(10) == 0 {
			f["gpu"] = true
		}
		var feats []any
		for _, x := range []string{"avx2", "avx512f", "sse4_2"} {
			if rng.IntN(2) == 0 {
				feats = append(feats, x)
			}
		}
		f["processor_features"] = feats
		return f
	}
}

var simPolicies = []policy.Policy{
	{Name: "storage", Tribe: "storage", Expr: `facts.storage_tier == true`},
	{Name: "bigmem", Tribe: "storage", Expr: `facts.memtotal_mb >= 48000`},
	{Name: "gpu", Tribe: "ml", Expr: `has(facts.gpu) && facts.gpu && "avx2" in facts.processor_features`},
	{Name: "rack3", Tribe: "rack-3", Expr: `facts.rack == 3`},
	{Name: "ubuntu-avx512", Tribe: "fast", Expr: `facts.os_dist == "ubuntu" && "avx512f" in facts.processor_features`},
}

// 300 nodes with random facts and several policies: on every node, every
// tribe's membership is exactly what the policies say of each node's facts.
// The cluster is sparse (each node linked to the three it joins, no DHT):
// policies need no rendezvous, and 300 full nodes take minutes to connect.
func TestPolicyMembershipMatchesFactsEverywhere(t *testing.T) {
	if testing.Short() {
		t.Skip("300 nodes: not in -short")
	}
	ctx := context.Background()
	const n = 300
	facts := randomFacts(8)
	s := start(t, Config{Nodes: n, Seed: 8, Joins: 3, Facts: facts, Sparse: true})
	if _, err := s.WaitFor(ctx, 3*time.Minute, func() bool { return s.Components() == 1 }); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{} // tribe -> member names
	for i := range n {
		for tribe := range policy.Desired(facts(i), simPolicies) {
			want[tribe] = append(want[tribe], fmt.Sprintf("n%d", i))
		}
	}
	for _, names := range want {
		slices.Sort(names)
	}
	for i, p := range simPolicies {
		if _, err := s.Node(i*37%n).CreatePolicy(ctx, p.Name, p.Tribe, p.Expr); err != nil {
			t.Fatal(err)
		}
	}
	// Read each node's replica directly: the API's views decode every
	// node record, too slow to poll across 300 nodes.
	names := map[string]string{}
	for i := range n {
		names[s.ID(i).String()] = fmt.Sprintf("n%d", i)
	}
	// wrong lists the tribes whose policy members node i sees wrongly.
	wrong := func(i int) []string {
		var out []string
		for tribe, members := range want {
			var got []string
			for _, e := range s.Node(i).Replica().Prefix("tribes/" + tribe + "/members/") {
				if id, ok := strings.CutSuffix(strings.TrimPrefix(e.Key, "tribes/"+tribe+"/members/"), "/policy"); ok {
					got = append(got, names[id])
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, members) {
				out = append(out, fmt.Sprintf("%s: %d of %d", tribe, len(got), len(members)))
			}
		}
		return out
	}
	took, err := s.WaitFor(ctx, 3*time.Minute, func() bool {
		for i := range n {
			if len(wrong(i)) > 0 {
				return false
			}
		}
		return true
	})
	if err != nil {
		shown := 0
		for i := range n {
			if w := wrong(i); len(w) > 0 && shown < 10 {
				t.Errorf("node %d sees %v", i, w)
				shown++
			}
		}
		t.Fatalf("memberships did not match the policies everywhere: %v; pubsub dropped %v", err, s.Dropped())
	}
	t.Logf("%d tribes with %v members agreed on all %d nodes after %v; pubsub dropped %v", len(want), sizes(want), n, took, s.Dropped())
}

func sizes(m map[string][]string) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[k] = len(v)
	}
	return out
}
