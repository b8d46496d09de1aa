// Package names checks the names tribe gives things: tribes, policies,
// plugins, tasks and jobs (Valid), and plugin methods (ValidMethod). One
// rule, in one place, checked by hand: a compiled regexp per package cost
// every process, the CLI's included, its compilation at start.
package names

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
