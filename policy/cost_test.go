package policy

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
)

// largestFacts are facts at the bounds any node's record is held to: a
// list and a map of MaxFactItems, lists in a list, a long string.
func largestFacts(t testing.TB) Facts {
	l := make([]any, MaxFactItems)
	for i := range l {
		l[i] = "a"
	}
	m := map[string]any{}
	for i := range MaxFactItems {
		m[fmt.Sprintf("k%d", i)] = int64(i)
	}
	ll := make([]any, 8)
	for i := range ll {
		ll[i] = l[:MaxFactItems/8]
	}
	f := Facts{"l": l, "m": m, "ll": ll, "s": strings.Repeat("a", 20<<10)}
	b, err := json.Marshal(f)
	if err != nil || len(b) > maxFactsSize || CheckJSON(b) != nil {
		t.Fatalf("facts past the bounds: %d bytes, %v", len(b), CheckJSON(b))
	}
	return f
}

// Walks of a list or a map in the facts are estimated from MaxFactItems,
// so the ordinary ones run without the limit's tracking; the estimate
// stays above what any node's facts cost, a shadowed facts and a range
// the expression computes included.
func TestCostEstimateOfWalks(t *testing.T) {
	facts := largestFacts(t)
	e, err := celEnv()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		expr      string
		untracked bool
	}{
		{`facts.l.exists(x, x.startsWith("10."))`, true},
		{`facts.l.all(x, x == "a")`, true},
		{`facts.l.exists(x, x in ["prod", "staging"])`, true},
		{`facts.l.filter(x, x == "a").size() > 0`, true},
		{`facts.m.exists(k, k.startsWith("team_"))`, true},
		{`facts.ll.exists(l, l.exists(x, x == "b"))`, false},
		{`facts.l.exists(x, x.matches("^b"))`, false}, // x may be a 64 KiB string
		{`facts.l.map(x, x + "/32").exists(c, c == "b")`, false},
		{`[facts.l + facts.l].exists(facts, facts.exists(y, y == "b"))`, false},
		{`(facts.l + facts.l).exists(y, y == "b")`, false},
		{`"b" in facts.l || size(facts.s) == 0 || facts.s.contains("b")`, true},
	}
	for _, tc := range cases {
		ast, iss := e.Compile(tc.expr)
		if iss.Err() != nil {
			t.Fatalf("%s: %v", tc.expr, iss.Err())
		}
		est, err := e.EstimateCost(ast, newFactsSizes(ast))
		if err != nil {
			t.Fatal(err)
		}
		if untracked := est.Max <= CostLimit; untracked != tc.untracked {
			t.Errorf("%s: estimated at most %d, untracked %v; want %v", tc.expr, est.Max, untracked, tc.untracked)
		}
		prg, err := e.Program(ast, cel.EvalOptions(cel.OptTrackCost))
		if err != nil {
			t.Fatal(err)
		}
		_, det, err := prg.Eval(activation{facts})
		if err != nil {
			t.Fatalf("%s: %v", tc.expr, err)
		}
		if got := *det.ActualCost(); got > est.Max {
			t.Errorf("%s: cost %d, estimated at most %d", tc.expr, got, est.Max)
		}
	}
}

// A literal regex is compiled with the program, not at each `matches`.
func TestMatchesLiteralRegexCompiledOnce(t *testing.T) {
	p, err := Compile(`facts.hostname.matches("^web-[0-9]+$")`)
	if err != nil {
		t.Fatal(err)
	}
	facts := Facts{"hostname": "web-12"}
	if ok, err := p.Eval(facts); !ok || err != nil {
		t.Fatalf("match %v, %v", ok, err)
	}
	if a := testing.AllocsPerRun(20, func() { p.Eval(facts) }); a > 5 {
		t.Errorf("%.0f allocations an evaluation: the regex is compiled each time", a)
	}
}
