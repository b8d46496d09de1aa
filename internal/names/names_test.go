package names

import (
	"regexp"
	"strings"
	"testing"
)

// The hand-written checks are the regexps they replace, on every string
// the fuzzer finds and on the edges.
var (
	nameRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	methodRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`)
)

func FuzzNamesAreTheRegexps(f *testing.F) {
	for _, s := range []string{"", "a", "A", "core", "web-1", ".x", "_x", "-x", "a.b_c-d", "Run", "a b", "é",
		strings.Repeat("a", 63), strings.Repeat("a", 64), "a\n", "a/b", "0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if Valid(s) != nameRE.MatchString(s) {
			t.Fatalf("Valid(%q) = %v, the regexp says %v", s, Valid(s), !Valid(s))
		}
		if ValidMethod(s) != methodRE.MatchString(s) {
			t.Fatalf("ValidMethod(%q) = %v, the regexp says %v", s, ValidMethod(s), !ValidMethod(s))
		}
	})
}
