package wire

import (
	"encoding/json"
	"testing"

	"github.com/tribeagent/tribe/internal/names"
)

// FuzzDecodeResponse: a plugin's stdout is bytes the agent did not write.
func FuzzDecodeResponse(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"result":{"a":1}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":2,"error":{"code":1,"message":"no","data":"out"}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":3,"result":1,"error":{"code":1,"message":"both"}}`))
	f.Add([]byte(`{"jsonrpc":"1.0","id":-1}`))
	f.Add([]byte(`{} {}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeResponse(b)
		if err != nil {
			return
		}
		if r.JSONRPC != "2.0" || r.ID < 0 || (r.Error == nil) == (len(r.Result) == 0) {
			t.Fatalf("accepted %q as %+v", b, r)
		}
		if r.Result != nil && !json.Valid(r.Result) {
			t.Fatalf("invalid result accepted from %q", b)
		}
	})
}

// FuzzDecodeInfo: a handshake answer decides what the agent registers.
func FuzzDecodeInfo(f *testing.F) {
	f.Add([]byte(`{"protocol":1,"name":"x","version":"1","kind":"action","methods":["run"]}`))
	f.Add([]byte(`{"protocol":1,"name":"x","version":"1","kind":"action","methods":["../etc"]}`))
	f.Add([]byte(`{"protocol":2}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := DecodeInfo(b, "x")
		if err != nil {
			return
		}
		if in.Name != "x" || in.Protocol != Protocol || len(in.Methods) == 0 || in.Version == "" {
			t.Fatalf("accepted %q as %+v", b, in)
		}
		for _, m := range in.Methods {
			if !names.ValidMethod(m) {
				t.Fatalf("method %q accepted", m)
			}
		}
	})
}
