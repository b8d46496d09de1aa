package node

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// The answers this node reads from the peers it asks: a member's task
// watch lines, a target's job output, a peer's plugin fetch header. Each
// is a peer's bytes: it reads or is refused, as a bad answer (counted) or
// as the peer's own refusal, and never panics.

func FuzzDecodeTaskRunLine(f *testing.F) {
	f.Add([]byte(`{"time":"2026-11-28T00:00:00Z","task":"m","tribe":"t","id":"x","name":"n","run":3,"ok":true,"ms":1.5,"output":"hi"}` + "\n"))
	f.Add([]byte(`{"error":"not a member"}`))
	f.Add([]byte(`{"id":"","error":""}`))
	f.Add([]byte(`{"output":1e999}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := decodeTaskRunLine(b)
		if err == nil && !json.Valid(bytes.TrimSpace(b)) {
			t.Fatalf("took %q as %+v", b, ev)
		}
	})
}

func FuzzDecodeJobOutputAnswer(f *testing.F) {
	f.Add([]byte(`{"output":"aGk="}`))
	f.Add([]byte(`{"error":"busy"}`))
	f.Add([]byte(`{"output":"!!"}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"output":"aGk="} trailing`))
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := decodeJobOutputAnswer(bytes.NewReader(b))
		if err == nil && len(out) > jobOutputMax {
			t.Fatalf("took %d bytes of output", len(out))
		}
		if err != nil && !errors.Is(err, errBadOutputAnswer) && err.Error() == "" {
			t.Fatalf("a refusal with no text for %q", b)
		}
	})
}

func FuzzDecodeFetchHeader(f *testing.F) {
	f.Add([]byte(`{"size":123}`+"\n"), int64(123))
	f.Add([]byte(`{"error":"no"}`), int64(1))
	f.Add([]byte(`{"size":-1}`), int64(1))
	f.Add([]byte(`{"size":1e30}`), int64(1))
	f.Add([]byte(`{}`), int64(0))
	f.Fuzz(func(t *testing.T, b []byte, want int64) {
		if decodeFetchHeader(b, want) != nil || want == 0 {
			return
		}
		// Taken: it says, as JSON reads it, a size of want.
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("took %q, which is not a JSON object: %v", b, err)
		}
		said := false
		for k, v := range m {
			var n int64
			said = said || strings.EqualFold(k, "size") && json.Unmarshal(v, &n) == nil && n == want
		}
		if !said {
			t.Fatalf("took %q for a size of %d", b, want)
		}
	})
}
