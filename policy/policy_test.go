package policy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseFactTypes(t *testing.T) {
	cases := []struct {
		in   string
		key  string
		want any
	}{
		{"storage_tier=true", "storage_tier", true},
		{"storage_tier=false", "storage_tier", false},
		{"rack=12", "rack", int64(12)},
		{"rack=-3", "rack", int64(-3)},
		{"weight=0.75", "weight", 0.75},
		{"zone=eu-west-1", "zone", "eu-west-1"},
		{"zone=", "zone", ""},
		{"label=True", "label", "True"}, // only lower-case true/false are bools
		{"v=1e400", "v", "1e400"},       // overflows a float: kept as text
		{"kv=a=b", "kv", "a=b"},
		{"zip=007", "zip", "007"}, // a leading zero: text, spelt as given
		{"zip=-007", "zip", "-007"},
		{"zero=0", "zero", int64(0)},
		{"w=0.5", "w", 0.5},
		{"w=00.5", "w", "00.5"},
		{"w=2e3", "w", 2000.0},
		{"serial=12345678901234567890", "serial", "12345678901234567890"}, // beyond int64: text, not a rounded float
		{"max=9223372036854775807", "max", int64(9223372036854775807)},
		{"plus=+5", "plus", "+5"},
		{"hex=0x1p4", "hex", "0x1p4"},
		{"nan=NaN", "nan", "NaN"},
	}
	for _, tc := range cases {
		k, v, err := ParseFact(tc.in)
		if err != nil || k != tc.key || !reflect.DeepEqual(v, tc.want) {
			t.Errorf("ParseFact(%q) = %q, %#v, %v; want %q, %#v", tc.in, k, v, err, tc.key, tc.want)
		}
	}
	for _, bad := range []string{"novalue", "=x", "Bad=1", "has space=1", "1abc=2", "dash-key=1"} {
		if _, _, err := ParseFact(bad); err == nil {
			t.Errorf("ParseFact(%q) accepted", bad)
		}
	}
}

func TestCompileRefusesWithCELMessage(t *testing.T) {
	cases := []struct {
		expr string
		msg  string
	}{
		{"facts.storage_tier ==", "Syntax error"},
		{"nosuchfn(facts.x)", "undeclared reference to 'nosuchfn'"},
		{"facts.cpu_count + 1", "must be a bool"},
		{"'a string'", "must be a bool"},
		{"other.x == 1", "undeclared reference to 'other'"},
		{"", "empty expression"},
		{strings.Repeat("x", MaxExprLen+1), "limit"},
		// Literals that fail on every node are refused up front.
		{`facts.hostname.matches("web-[")`, "invalid matches argument"},
		{`duration(facts.uptime) > duration("1x")`, "invalid duration"},
		{`timestamp("yesterday") < timestamp(facts.boot)`, "invalid timestamp"},
	}
	for _, tc := range cases {
		_, err := Compile(tc.expr)
		if !errors.Is(err, ErrCompile) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("Compile(%.40q) = %v, want ErrCompile mentioning %q", tc.expr, err, tc.msg)
		}
	}
}

func TestEval(t *testing.T) {
	facts := Facts{
		"os_dist":            "ubuntu",
		"storage_tier":       true,
		"cpu_count":          int64(8),
		"memtotal_mb":        int64(32000),
		"weight":             0.5,
		"processor_features": []any{"avx2", "sse4_2"},
		"rack":               map[string]any{"row": "b", "slot": int64(7)},
	}
	cases := []struct {
		expr    string
		match   bool
		missing bool
	}{
		{`facts.os_dist == "ubuntu" && facts.storage_tier == true`, true, false},
		{`facts.storage_tier`, true, false},
		{`facts.cpu_count > 4`, true, false},
		{`facts.cpu_count > 4.5`, true, false}, // int vs double
		{`facts.weight < 1`, true, false},
		{`"avx2" in facts.processor_features`, true, false},
		{`"avx512f" in facts.processor_features`, false, false},
		{`facts.rack.row == "b" && facts.rack.slot == 7`, true, false},
		{`facts.gpu == true`, false, true},
		{`facts.rack.shelf == 1`, false, true},
		{`has(facts.gpu) && facts.gpu`, false, false},
		{`facts.os_dist.startsWith("ubu")`, true, false},
	}
	for _, tc := range cases {
		p, err := Compile(tc.expr)
		if err != nil {
			t.Errorf("Compile(%q): %v", tc.expr, err)
			continue
		}
		got, err := p.Eval(facts)
		if got != tc.match || errors.Is(err, ErrMissingFact) != tc.missing {
			t.Errorf("%q: match %v err %v; want match %v missing %v", tc.expr, got, err, tc.match, tc.missing)
		}
	}
}

func TestEvalRuntimeErrorsAreNoMatch(t *testing.T) {
	// A type mismatch at run time (dyn) and the cost limit: errors, no match.
	p, _ := Compile(`facts.cpu_count == "eight"`)
	if ok, _ := p.Eval(Facts{"cpu_count": int64(8)}); ok {
		t.Error("mismatched types matched")
	}
	p, _ = Compile(`facts.cpu_count`) // dyn: compiles, but is not a bool here
	if ok, err := p.Eval(Facts{"cpu_count": int64(8)}); ok || err == nil || !strings.Contains(err.Error(), "not a bool") {
		t.Errorf("non-bool result: %v, %v", ok, err)
	}
	p, err := Compile(`[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, [1,2,3,4,5,6,7,8,9,10].all(e, a+b+c+d+e > 0)))))`)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := p.Eval(Facts{})
	if ok || err == nil || !strings.Contains(err.Error(), "cost") {
		t.Errorf("runaway expression: match %v, err %v; want the cost limit", ok, err)
	}
}

// Compiled programs are shared by expression text, across goroutines;
// refused expressions are not kept.
func TestCompileSharesPrograms(t *testing.T) {
	const expr = `facts.rack == 41 && facts.zone == "shared"`
	progs := make(chan *Program, 8)
	for range cap(progs) {
		go func() {
			p, err := Compile(expr)
			if err != nil {
				t.Error(err)
			}
			progs <- p
		}()
	}
	for range cap(progs) {
		p := <-progs
		if ok, err := p.Eval(Facts{"rack": int64(41), "zone": "shared"}); !ok || err != nil {
			t.Errorf("shared program: %v, %v", ok, err)
		}
	}
	if again, _ := Compile(expr); again != cache.get(expr) || again == nil {
		t.Errorf("a compiled expression is not served from the cache")
	}
	if _, err := Compile(`facts.`); err == nil || cache.get(`facts.`) != nil {
		t.Errorf("refused expression: err %v, cached %v", err, cache.get(`facts.`) != nil)
	}
}

func TestDesired(t *testing.T) {
	policies := []Policy{
		{Name: "storage", Tribe: "storage", Expr: `facts.storage_tier == true`},
		{Name: "big", Tribe: "storage", Expr: `facts.memtotal_mb > 16000`},
		{Name: "gpu", Tribe: "ml", Expr: `facts.gpu == true`},
		{Name: "broken", Tribe: "x", Expr: `facts.`},
	}
	got := Desired(Facts{"storage_tier": true, "memtotal_mb": int64(32000)}, policies)
	want := map[string][]string{"storage": {"big", "storage"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Desired = %v, want %v", got, want)
	}
	outs := Evaluate(Facts{}, policies)
	if !errors.Is(outs[2].Err, ErrMissingFact) || !errors.Is(outs[3].Err, ErrCompile) {
		t.Fatalf("outcomes: %+v", outs)
	}
}

func TestFactsFileAndJSON(t *testing.T) {
	dir := t.TempDir()
	y := filepath.Join(dir, "facts.yaml")
	os.WriteFile(y, []byte("storage_tier: true\nrack:\n  row: b\n  slot: 7\ntags: [a, b]\nweight: 0.5\n"), 0o600)
	f, err := LoadFactsFile(y)
	if err != nil {
		t.Fatal(err)
	}
	want := Facts{"storage_tier": true, "rack": map[string]any{"row": "b", "slot": int64(7)}, "tags": []any{"a", "b"}, "weight": 0.5}
	if !reflect.DeepEqual(f, want) {
		t.Fatalf("yaml facts = %#v", f)
	}
	j := filepath.Join(dir, "facts.json")
	os.WriteFile(j, []byte(`{"storage_tier": true, "rack": {"row": "b", "slot": 7}, "tags": ["a","b"], "weight": 0.5}`), 0o600)
	if f, err := LoadFactsFile(j); err != nil || !reflect.DeepEqual(f, want) {
		t.Fatalf("json facts = %#v, %v", f, err)
	}
	os.WriteFile(y, []byte("Bad-Key: 1\n"), 0o600)
	if _, err := LoadFactsFile(y); err == nil {
		t.Fatal("bad key accepted")
	}
	// Facts stored as JSON come back with whole numbers as ints.
	back, err := DecodeJSON([]byte(`{"cpu_count": 8, "weight": 0.5, "nested": {"n": 3}}`))
	if err != nil || back["cpu_count"] != int64(8) || back["weight"] != 0.5 || back["nested"].(map[string]any)["n"] != int64(3) {
		t.Fatalf("DecodeJSON = %#v, %v", back, err)
	}
}

func TestCollectBuiltins(t *testing.T) {
	f, err := Collect(context.Background())
	if err != nil {
		t.Logf("some facts could not be read: %v", err)
	}
	for _, name := range []string{"hostname", "os", "architecture", "cpu_count", "memtotal_mb", "kernel_version", "boot_time", "ipv4", "virtual", "fqdn"} {
		if _, ok := f[name]; !ok {
			t.Errorf("built-in fact %s missing: %v", name, f)
		}
	}
	if n, ok := f["cpu_count"].(int64); !ok || n < 1 {
		t.Errorf("cpu_count = %#v", f["cpu_count"])
	}
	for name := range f {
		known := false
		for _, b := range BuiltinNames {
			known = known || b == name
		}
		if !known {
			t.Errorf("Collect returned %q, which BuiltinNames does not list", name)
		}
	}
}

func TestOSFamilyAndFQDN(t *testing.T) {
	for _, tc := range []struct{ id, like, want string }{
		{"ubuntu", "debian", "Debian"}, {"debian", "", "Debian"}, {"rocky", "rhel centos fedora", "RedHat"},
		{"opensuse-leap", "suse opensuse", "Suse"}, {"alpine", "", "Alpine"}, {"nixos", "", "Nixos"},
	} {
		if got := osFamily(tc.id, tc.like); got != tc.want {
			t.Errorf("osFamily(%q, %q) = %q, want %q", tc.id, tc.like, got, tc.want)
		}
	}
	hosts := filepath.Join(t.TempDir(), "hosts")
	os.WriteFile(hosts, []byte("127.0.0.1 localhost\n10.0.0.5 web1.example.com web1 # the box\n"), 0o600)
	if got := fqdn("web1", hosts); got != "web1.example.com" {
		t.Errorf("fqdn = %q", got)
	}
	if got := fqdn("db1", hosts); got != "db1" {
		t.Errorf("fqdn unknown = %q", got)
	}
	if got := fqdn("x.y.z", hosts); got != "x.y.z" {
		t.Errorf("fqdn qualified = %q", got)
	}
}

// facts is map(string, dyn) and a fact's type is each node's own (user facts
// and the facts file override the built-in ones), so a comparison CEL cannot
// refuse, such as a number fact against text, may still match some node: it
// is accepted, and matches where the types agree.
func TestDynComparisonsAreAcceptedAndMatchWhereTypesAgree(t *testing.T) {
	p, err := Compile(`facts.cpu_count > "a"`)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := p.Eval(Facts{"cpu_count": int64(8)}); ok || err == nil {
		t.Errorf("number fact: %v, %v; want no match with an error", ok, err)
	}
	if ok, err := p.Eval(Facts{"cpu_count": "b"}); !ok || err != nil {
		t.Errorf("text fact: %v, %v; want a match", ok, err)
	}
}
