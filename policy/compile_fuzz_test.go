package policy

import (
	"errors"
	"strings"
	"testing"
)

// FuzzCompile: a policy's expression comes in a replicated entry, and
// every node compiles it. It compiles or is refused with ErrCompile, and a
// program that compiles evaluates without a panic, within its cost limit.
func FuzzCompile(f *testing.F) {
	f.Add(`facts.os == "linux"`)
	f.Add(`facts.cpu_count > 4`)
	f.Add(`[1,2].map(x, x*x).size() > 0`)
	f.Add(`"a" +`)
	f.Add(`facts.l.exists(a, facts.l.exists(b, false))`)
	f.Add(`facts.name.matches("^(a+)+$")`)
	f.Add(strings.Repeat("(", 200) + "true" + strings.Repeat(")", 200))
	facts := Facts{"os": "linux", "cpu_count": int64(8), "name": strings.Repeat("a", 64), "l": []any{int64(1), int64(2), int64(3)}}
	f.Fuzz(func(t *testing.T, expr string) {
		p, err := Compile(expr)
		if err != nil {
			if !errors.Is(err, ErrCompile) {
				t.Fatalf("%q: %v, not ErrCompile", expr, err)
			}
			return
		}
		p.Eval(facts)
	})
}
