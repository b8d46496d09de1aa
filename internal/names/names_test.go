package names

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
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

func TestPrintable(t *testing.T) {
	for _, c := range []struct {
		s    string
		want bool
	}{
		{"", true},
		{"web-1.example", true},
		{"db 7 (rack b)", true},
		{"žluťoučký kůň", true},
		{"東京-3", true},
		{"a\x1b[2Kb", false}, // an escape sequence: erases the line
		{"a\rb", false},      // back to the line's start
		{"a\nb", false},      // a new row
		{"a\tb", false},      // a new column
		{"a\x7fb", false},    // DEL
		{"a\u009bb", false},  // CSI as a C1 control
		{"a\u202eb", false},  // right-to-left override
		{"a\u200bb", false},  // zero-width space
		{"a\u00a0b", false},  // a space that is not ASCII's
		{"a\xffb", false},    // not UTF-8
		{"a\xe2\x80", false}, // a rune cut short
	} {
		if got := Printable(c.s); got != c.want {
			t.Errorf("Printable(%q) = %v, want %v", c.s, got, c.want)
		}
	}
	if got := Shown("db7\x1b[2K\rweb1"); got != `"db7\x1b[2K\rweb1"` {
		t.Errorf("Shown = %s, want the escapes quoted", got)
	}
	if got := Shown("web-1"); got != "web-1" {
		t.Errorf("Shown(web-1) = %s", got)
	}
}

// Printable is what strconv.Quote leaves as it is, and Shown's text is
// always Printable.
func FuzzPrintableIsWhatQuoteKeeps(f *testing.F) {
	for _, s := range []string{"", "a", "a\x1b", "\u202e", "\xff", "é", "a\tb", "\u00a0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !strings.ContainsAny(s, `"\`) {
			if kept := strconv.Quote(s) == `"`+s+`"`; Printable(s) != kept {
				t.Fatalf("Printable(%q) = %v, strconv.Quote keeps it: %v", s, Printable(s), kept)
			}
		}
		if !Printable(Shown(s)) {
			t.Fatalf("Shown(%q) = %q, not printable", s, Shown(s))
		}
	})
}

func TestCut(t *testing.T) {
	for _, c := range []struct {
		s     string
		limit int
		more  string
		want  string
	}{
		{"short", 10, "...", "short"},
		{"exactly10!", 10, "...", "exactly10!"},
		{"a longer text", 10, "...", "a longe..."},
		{"ééééé", 5, "", "éé"},    // é is 2 bytes: not cut inside one
		{"aééé", 6, "+", "aéé+"},  // 5 bytes of text, then the mark
		{"éééé", 2, "...", "..."}, // no room for text
		{"abcdef", 3, "", "abc"},
	} {
		got := Cut(c.s, c.limit, c.more)
		if got != c.want || len(got) > max(c.limit, len(c.more)) || !utf8.ValidString(got) {
			t.Errorf("Cut(%q, %d, %q) = %q, want %q", c.s, c.limit, c.more, got, c.want)
		}
	}
}
