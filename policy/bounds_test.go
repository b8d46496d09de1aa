package policy

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// nested is a value nested depth deep: depth 1 is a scalar.
func nested(depth int) string {
	return strings.Repeat("[", depth-1) + "1" + strings.Repeat("]", depth-1)
}

// list is a JSON list of n ones.
func list(n int) string {
	return "[" + strings.TrimSuffix(strings.Repeat("1,", n), ",") + "]"
}

func boundCases() []string {
	keys := func(n int) string {
		var b strings.Builder
		b.WriteString("{")
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `"k%d":1`, i)
		}
		return b.String() + "}"
	}
	return []string{
		`{}`, ` { } `, `{"os":"linux","cpus":4,"load":0.5,"ok":true,"none":null,"tags":["a","b"],"rack":{"row":"b"}}`,
		`{"s":"a\"b\\c\u0041"}`,
		`{"x":` + nested(MaxFactDepth) + `}`, `{"x":` + nested(MaxFactDepth+1) + `}`,
		`{"l":` + list(MaxFactItems) + `}`, `{"l":` + list(MaxFactItems+1) + `}`,
		`{"m":` + keys(MaxFactItems) + `}`, `{"m":` + keys(MaxFactItems+1) + `}`,
		keys(MaxFactItems), keys(MaxFactItems + 1),
		`{"a":` + list(1000) + `,"b":` + list(1000) + `,"c":` + list(1000) + `,"d":` + list(1000) + `}`,
		`{"a":` + list(1000) + `,"b":` + list(1000) + `,"c":` + list(1000) + `,"d":` + list(1020) + `}`,
		`{"n":9223372036854775807}`, `{"n":9223372036854775808}`, `{"n":-1e308}`, `{"n":1e999}`, `{"n":-0.0}`,
		`null`, ` null `, `[]`, `"x"`, `7`, `{"a":1} x`, `{"a"}`, `{"a":[1,]}`, `{"a":tru}`,
	}
}

// CheckJSON takes what DecodeJSON takes and refuses what it refuses, on
// the bounds' edges.
func TestCheckJSONAgreesWithDecodeJSON(t *testing.T) {
	for _, c := range boundCases() {
		if !json.Valid([]byte(c)) {
			continue
		}
		_, derr := DecodeJSON([]byte(c))
		cerr := CheckJSON([]byte(c))
		if (derr == nil) != (cerr == nil) {
			t.Errorf("%.80s: DecodeJSON %v, CheckJSON %v", c, derr, cerr)
		}
	}
}

// Whatever CheckJSON takes, DecodeJSON takes (a record a node admits has
// its facts everywhere); whatever DecodeJSON takes, written again as an
// agent writes its facts, CheckJSON takes (no honest record is refused).
// On any bytes, CheckJSON does not panic.
func FuzzCheckJSON(f *testing.F) {
	for _, c := range boundCases() {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cerr := CheckJSON(b)
		if !json.Valid(b) {
			return
		}
		facts, derr := DecodeJSON(b)
		if cerr == nil && derr != nil {
			t.Fatalf("CheckJSON takes %q, DecodeJSON refuses it: %v", b, derr)
		}
		if derr != nil {
			return
		}
		again, err := json.Marshal(facts)
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckJSON(again); err != nil {
			t.Fatalf("CheckJSON refuses %q as an agent writes it: %v", again, err)
		}
	})
}
