package policy

import (
	"testing"
	"time"
)

// BenchmarkEvalVsBareCEL: the cost of evaluating one policy on one node
// through Evaluate (the path every node takes on each change) against a
// bare cel-go evaluation of the same compiled expression on the same
// activation, timed side by side. Target: at most 2x.
func BenchmarkEvalVsBareCEL(b *testing.B) {
	const expr = `facts.os_dist == "ubuntu" && facts.storage_tier == true && "avx2" in facts.processor_features && facts.memtotal_mb > 16000`
	facts := Facts{
		"os_dist": "ubuntu", "storage_tier": true, "memtotal_mb": int64(32000),
		"processor_features": []any{"avx", "avx2", "sse4_2"}, "hostname": "web-1", "cpu_count": int64(8),
	}
	p, err := (Policy{Name: "p", Tribe: "t", Expr: expr}).WithProgram()
	if err != nil {
		b.Fatal(err)
	}
	policies := []Policy{p}
	env, _ := celEnv()
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		b.Fatal(iss.Err())
	}
	bare, err := env.Program(ast)
	if err != nil {
		b.Fatal(err)
	}
	activation := map[string]any{"facts": map[string]any(facts)}
	const inner = 20000
	var ours, raw time.Duration
	for range b.N {
		start := time.Now()
		for range inner {
			if out := Evaluate(facts, policies); !out[0].Match {
				b.Fatal("no match")
			}
		}
		ours += time.Since(start)
		start = time.Now()
		for range inner {
			if out, _, err := bare.Eval(activation); err != nil || out.Value() != true {
				b.Fatal("bare: no match")
			}
		}
		raw += time.Since(start)
	}
	evals := float64(inner * b.N)
	b.ReportMetric(float64(ours.Nanoseconds())/evals, "ns/policy_eval")
	b.ReportMetric(float64(raw.Nanoseconds())/evals, "ns/bare_cel_eval")
	b.ReportMetric(float64(ours)/float64(raw), "policy/bare_ratio")
}

// BenchmarkEvalWalkLargestFacts: an ordinary walk of a list in the facts,
// over a node's facts at their bounds (MaxFactItems elements): what a
// node's facts can make every other node spend on one evaluation.
func BenchmarkEvalWalkLargestFacts(b *testing.B) {
	facts := largestFacts(b)
	for _, expr := range []string{
		`facts.l.exists(x, x.startsWith("10."))`,
		`facts.l.exists(x, x.matches("^10[.]"))`,
	} {
		p, err := Compile(expr)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(expr, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if ok, err := p.Eval(facts); ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		})
	}
}
