package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode"

	"github.com/tribeagent/tribe/node/api"
)

// A pending node's record is any peer's to write: text in it must neither
// reach the terminal as control characters nor move the table's columns
// or rows.
func TestTablesShowPeersTextEscaped(t *testing.T) {
	hostile := "web1\t12D3fake\talive\x1b[2K\r\nevil\u202e"
	var b bytes.Buffer
	err := printNodes(&b, []api.Node{
		{ID: "12D3real", Name: hostile, Liveness: "alive", Admission: "pending", Version: "v\x1b]0;title\x07",
			Facts: map[string]any{"k\x1b": "v\x9b"}},
		{ID: "12D3next", Name: "db1", Liveness: "alive", Admission: "admitted", Version: "0.1.0", Self: true},
	}, true)
	if err != nil {
		t.Fatal(err)
	}
	out := b.String()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want a header and 2 rows:\n%s", len(lines), out)
	}
	if i := strings.IndexFunc(out, func(r rune) bool {
		return r != '\n' && (r < ' ' || r == 0x7f || r >= 0x80 && r < 0xa0 || r == '\u202e')
	}); i >= 0 {
		t.Fatalf("a control or format character reached the output at %d: %q", i, out)
	}
	for _, want := range []string{`"web1\t12D3fake\talive\x1b[2K\r\nevil\u202e"`, `"v\x1b]0;title\a"`, `12D3real`, "db1 (this node)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %s:\n%s", want, out)
		}
	}
	if f := strings.Fields(lines[1]); f[1] != "12D3real" {
		t.Errorf("the ID column holds %q: the name moved the columns:\n%s", f[1], out)
	}

	b.Reset()
	printCallResult(&b, api.CallResult{Name: "x\x1b[1A", Code: "bad\ncode", Error: "boom\x1b[31m"})
	if out := b.String(); strings.Count(out, "\n") != 1 || strings.ContainsRune(out, 0x1b) {
		t.Errorf("a call's answer line holds control characters: %q", out)
	}
}

// An error is shown line by line: another node's text in it is quoted, a
// CEL error keeps its caret line.
func TestErrorLinesShown(t *testing.T) {
	cel := "ERROR: <input>:1:7: undeclared reference\n | facts.x ==\n | ......^"
	if got := shownLines(cel); got != cel {
		t.Errorf("a CEL error changed:\n%s", got)
	}
	got := shownLines("job j: node b: exit 1: \x1b]52;c;cm0gLXJmIH4=\x07")
	if strings.ContainsRune(got, 0x1b) || !strings.Contains(got, `\x1b]52`) {
		t.Errorf("a target's error reached the terminal as it is: %q", got)
	}
}

// --json output has no rune a terminal would obey, and decodes to the
// same text.
func TestJSONOutputEscapesWhatIsNotPrintable(t *testing.T) {
	in := api.Node{Name: "db\u202e1\u009b[2J\x7f\u00a0ž😀", Facts: map[string]any{"k": "\x1b]52;c;x\x07"}}
	var b bytes.Buffer
	if err := printJSON(&b, in); err != nil {
		t.Fatal(err)
	}
	if i := strings.IndexFunc(b.String(), func(r rune) bool { return r == 0x7f || r >= 0x80 && !unicode.IsPrint(r) || r < ' ' && r != '\n' }); i >= 0 {
		t.Fatalf("a rune that is not printable at %d: %q", i, b.String())
	}
	if !strings.Contains(b.String(), `\u202e`) || !strings.Contains(b.String(), "ž😀") {
		t.Errorf("escapes or printable runes wrong: %s", b.String())
	}
	var out api.Node
	if err := json.Unmarshal(b.Bytes(), &out); err != nil || out.Name != in.Name || out.Facts["k"] != in.Facts["k"] {
		t.Fatalf("decoded %+v, %v; want %+v", out, err, in)
	}
}
