// Package names checks the names tribe gives things: tribes, policies,
// plugins, tasks and jobs (Valid), and plugin methods (ValidMethod), and
// whether text a peer sent may be shown as it is (Printable, Shown). One
// rule, in one place, checked by hand: a compiled regexp per package cost
// every process, the CLI's included, its compilation at start.
package names

import (
	"strconv"
	"unicode"
	"unicode/utf8"
)

// MaxLen is the longest a name or a method may be.
const MaxLen = 63

// Valid reports whether s may name a tribe, policy, plugin, task or job:
// 1 to 63 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit
// (the regexp ^[a-z0-9][a-z0-9._-]{0,62}$).
func Valid(s string) bool { return valid(s, false) }

// ValidMethod reports whether s may name a plugin method: as Valid, and
// upper-case letters too.
func ValidMethod(s string) bool { return valid(s, true) }

func valid(s string, upper bool) bool {
	if len(s) == 0 || len(s) > MaxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case upper && c >= 'A' && c <= 'Z':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// Printable reports whether s is valid UTF-8 in which every rune is
// printable (unicode.IsPrint: letters, marks, digits, punctuation,
// symbols and the ASCII space): no control character (an escape
// sequence to a terminal, a tab or a newline that shifts a table's
// columns or rows), no format character (a bidirectional override that
// shows text reversed, a zero-width space), no other space. What a peer
// says of itself is shown in operators' terminals; Printable is what
// such text must be to be shown as it is.
func Printable(s string) bool {
	for i := 0; i < len(s); {
		if c := s[i]; c >= 0x20 && c < 0x7f {
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n <= 1 || !unicode.IsPrint(r) {
			return false
		}
		i += n
	}
	return true
}

// Shown returns s as it is when Printable, else quoted with Go's escapes
// (strconv.Quote: "\x1b[2K", "\u202e", "\n"), so that a terminal shows
// what the text holds instead of obeying it.
func Shown(s string) string {
	if Printable(s) {
		return s
	}
	return strconv.Quote(s)
}

// Cut is s cut to at most limit bytes, more included, at a rune's start (a
// rune cut in two would be shown escaped), with more at the end if it
// was cut: text a peer sent, held or shown within a bound.
func Cut(s string, limit int, more string) string {
	if len(s) <= limit {
		return s
	}
	i := max(0, limit-len(more))
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + more
}
