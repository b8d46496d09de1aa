package policy

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// CheckJSON reports whether b, a node's facts as JSON, is within the
// bounds DecodeJSON holds facts to (MaxFactItems, MaxFactValues,
// MaxFactDepth; numbers an int64 or a float64 holds), without decoding
// them: it allocates nothing, and takes a few microseconds where
// DecodeJSON takes tens, so a node can check every record that comes
// before it takes it. b must be valid JSON (as json.Unmarshal leaves a
// json.RawMessage); on other bytes it returns an error or a result of no
// meaning, never panics. It may refuse facts DecodeJSON takes only when
// an object repeats a key (each counts here, the last wins there), which
// no agent writes.
func CheckJSON(b []byte) error {
	s := boundScan{b: b, values: MaxFactValues}
	s.space()
	switch {
	case bytes.HasPrefix(s.b[s.i:], []byte("null")):
		s.i += len("null") // no facts, as DecodeJSON reads it
	case s.i < len(s.b) && s.b[s.i] == '{':
		if err := s.container(0, '}'); err != nil {
			return err
		}
	default:
		return errors.New("facts: not a JSON object")
	}
	s.space()
	if s.i != len(s.b) {
		return errors.New("facts: bytes after the object")
	}
	return nil
}

// boundScan walks JSON, counting what DecodeJSON's budget counts.
type boundScan struct {
	b      []byte
	i      int
	values int // left in the budget
}

var errBadJSON = errors.New("facts: not valid JSON")

func (s *boundScan) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value scans one value at depth (a top-level fact is at depth 1).
func (s *boundScan) value(depth int) error {
	if s.values--; s.values < 0 {
		return fmt.Errorf("more than %d values in all", MaxFactValues)
	}
	if depth > MaxFactDepth {
		return fmt.Errorf("nested more than %d deep", MaxFactDepth)
	}
	s.space()
	if s.i >= len(s.b) {
		return errBadJSON
	}
	switch c := s.b[s.i]; {
	case c == '{':
		return s.container(depth, '}')
	case c == '[':
		return s.container(depth, ']')
	case c == '"':
		return s.str()
	case c == 't' || c == 'f' || c == 'n':
		for s.i < len(s.b) && s.b[s.i] >= 'a' && s.b[s.i] <= 'z' {
			s.i++
		}
		return nil
	default:
		return s.number()
	}
}

// container scans an object (end '}') or an array (end ']') whose
// elements are at depth+1; the top-level object is at depth 0.
func (s *boundScan) container(depth int, end byte) error {
	s.i++ // '{' or '['
	s.space()
	if s.i < len(s.b) && s.b[s.i] == end {
		s.i++
		return nil
	}
	for n := 1; ; n++ {
		if n > MaxFactItems {
			switch {
			case depth == 0:
				return fmt.Errorf("more than %d facts", MaxFactItems)
			case end == '}':
				return fmt.Errorf("a map of more than %d keys", MaxFactItems)
			}
			return fmt.Errorf("a list of more than %d elements", MaxFactItems)
		}
		if end == '}' {
			s.space()
			if s.i >= len(s.b) || s.b[s.i] != '"' {
				return errBadJSON
			}
			if err := s.str(); err != nil {
				return err
			}
			s.space()
			if s.i >= len(s.b) || s.b[s.i] != ':' {
				return errBadJSON
			}
			s.i++
		}
		if err := s.value(depth + 1); err != nil {
			return err
		}
		s.space()
		if s.i >= len(s.b) {
			return errBadJSON
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case end:
			s.i++
			return nil
		default:
			return errBadJSON
		}
	}
}

// str scans a string, its quotes included.
func (s *boundScan) str() error {
	for s.i++; s.i < len(s.b); s.i++ {
		switch s.b[s.i] {
		case '\\':
			s.i++ // the escaped byte; \uXXXX's digits are no quote
		case '"':
			s.i++
			return nil
		}
	}
	return errBadJSON
}

// number scans a number and checks that DecodeJSON can hold it: an
// int64, or a float64 (1e999 is neither).
func (s *boundScan) number() error {
	start, float := s.i, false
	for ; s.i < len(s.b); s.i++ {
		c := s.b[s.i]
		if c == '.' || c == 'e' || c == 'E' {
			float = true
		} else if !(c >= '0' && c <= '9' || c == '-' || c == '+') {
			break
		}
	}
	tok := string(s.b[start:s.i])
	if tok == "" {
		return errBadJSON
	}
	if !float {
		if _, err := strconv.ParseInt(tok, 10, 64); err == nil {
			return nil
		}
	}
	if _, err := strconv.ParseFloat(tok, 64); err != nil {
		return fmt.Errorf("the number %s: %w", tok, err)
	}
	return nil
}
