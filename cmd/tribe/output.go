package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/tribeagent/tribe/internal/names"
)

// How the CLI prints what the agent answers: tables and JSON, with text
// from other nodes made safe to show in a terminal.

func table(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// row writes one row of a table: its cells, each as names.Shown shows
// it, between tabs. Names, versions, errors, facts and outputs come from
// other nodes, and some of them from any peer that can connect (a pending
// node's record): a tab or a newline in one would move the table's
// columns or rows, and an escape sequence would drive the terminal of the
// operator reading it (erase a line, retitle the window, set the
// clipboard). Shown quotes such text, escapes visible.
func row(w io.Writer, cells ...any) {
	b := make([]byte, 0, 128)
	for i, c := range cells {
		if i > 0 {
			b = append(b, '\t')
		}
		s, ok := c.(string)
		if !ok {
			s = fmt.Sprint(c)
		}
		b = append(b, names.Shown(s)...)
	}
	w.Write(append(b, '\n'))
}

func printJSON(w io.Writer, v any) error {
	enc := jsonEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// jsonEncoder is the CLI's JSON encoder: Go's, whose output then has
// every rune that is not printable (and DEL) as a \u escape. Go escapes
// the control characters under 0x20 in strings, but writes DEL, the C1
// controls (U+009B is a terminal's CSI) and bidi overrides as they are,
// and --json output is often read in a terminal. The escapes decode to
// the same strings.
func jsonEncoder(w io.Writer) *json.Encoder { return json.NewEncoder(printableJSON{w}) }

// printableJSON writes JSON with its non-printable runes escaped. Each
// Write is one whole value (json.Encoder writes one per Encode), and
// outside strings JSON is printable ASCII and whitespace, so every such
// rune is in a string, where a \u escape means it.
type printableJSON struct{ w io.Writer }

func (p printableJSON) Write(b []byte) (int, error) {
	i := 0
	for i < len(b) && b[i] < 0x7f {
		i++
	}
	if i == len(b) {
		return p.w.Write(b) // all ASCII, no DEL: the common case
	}
	out := append(make([]byte, 0, len(b)+16), b[:i]...)
	for _, r := range string(b[i:]) {
		switch {
		case r < 0x7f:
			out = append(out, byte(r))
		case r != 0x7f && unicode.IsPrint(r):
			out = utf8.AppendRune(out, r)
		default:
			for _, u := range utf16.AppendRune(nil, r) {
				out = fmt.Appendf(out, `\u%04x`, u)
			}
		}
	}
	if _, err := p.w.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}
