package wire

import (
	"bytes"
	"encoding/json"
	"reflect"
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

// FuzzDecodeResultAgreesWithStrict: the fast path takes only what the
// strict decoder takes, as it takes it.
func FuzzDecodeResultAgreesWithStrict(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"result":{"a":1}}` + "\n"))
	f.Add([]byte(`{"jsonrpc":"2.0","id":12,"result": "x" }`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":3,"result":1,"error":{"code":1,"message":"both"}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":3,"result":null}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":007,"result":[1]}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"result":{"a":1}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		fast, ok := decodeResult(b)
		if !ok {
			return
		}
		strict, err := decodeStrict(b)
		if err != nil {
			t.Fatalf("fast path took %q, the strict decoder refuses it: %v", b, err)
		}
		if !reflect.DeepEqual(fast, strict) {
			t.Fatalf("%q: fast path %+v, strict %+v", b, fast, strict)
		}
	})
}

// FuzzEncodeCallAgreesWithMarshal: a call's line is what Marshal would
// write, byte for byte, on one line.
func FuzzEncodeCallAgreesWithMarshal(f *testing.F) {
	f.Add(int64(1), "echo", []byte(`{"a": [1, 2]}`), int64(30000))
	f.Add(int64(0), "a\"b<\n", []byte("\"x\"\n"), int64(1))
	f.Add(int64(3), "echo", []byte("[\"<a>&\u2028\u2029\", \"\\u2028\"]"), int64(2))
	f.Add(int64(9), "run", []byte(nil), int64(5))
	f.Fuzz(func(t *testing.T, id int64, method string, args []byte, timeout int64) {
		if len(args) > 0 && !json.Valid(args) {
			return // the agent passes only JSON it decoded
		}
		got := EncodeRequest(Request{ID: &id, Method: MethodCall, Params: CallParams{Method: method, TimeoutMS: timeout, Args: args}})
		if bytes.IndexByte(got, '\n') != len(got)-1 {
			t.Fatalf("not one line: %q", got)
		}
		want, err := json.Marshal(Request{JSONRPC: "2.0", ID: &id, Method: MethodCall, Params: CallParams{Method: method, TimeoutMS: timeout, Args: args}})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, append(want, '\n')) {
			t.Fatalf("wrote %q, Marshal %q", got, want)
		}
	})
}

// An error with an empty message (JSON-RPC allows it) fails its call,
// saying it had none, instead of being taken for garbage.
func TestErrorWithNoMessage(t *testing.T) {
	r, err := DecodeResponse([]byte(`{"jsonrpc":"2.0","id":3,"error":{"code":1,"message":""}}`))
	if err != nil || r.ID != 3 || r.Error == nil || r.Error.Message != NoMessage {
		t.Fatalf("%+v %v", r, err)
	}
}

// A line with a '}' or ']' after its value is refused, by the fast path
// and the strict decoder alike (json.Decoder's More took those for the
// end of the input).
func TestDecodeResponseRefusesDataAfterTheValue(t *testing.T) {
	for _, line := range []string{
		`{"jsonrpc":"2.0","id":1,"result":1}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"a":1}}]`,
		`{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x"}}}`,
		`{"jsonrpc":"2.0","id":1,"result":1} {}`,
	} {
		if r, err := DecodeResponse([]byte(line)); err == nil {
			t.Errorf("%s taken as %+v", line, r)
		}
	}
}
