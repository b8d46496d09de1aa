package sdk

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/tribeagent/tribe/plugins/external/wire"
)

// FuzzParseCallAgreesWithUnmarshal: the agent's stdin is read first by
// wire.ParseCall, which must take only what json.Unmarshal takes, as it
// takes it.
func FuzzParseCallAgreesWithUnmarshal(f *testing.F) {
	id := int64(7)
	f.Add(wire.EncodeRequest(wire.Request{ID: &id, Method: wire.MethodCall, Params: wire.CallParams{Method: "echo", TimeoutMS: 30000, Args: json.RawMessage(`{"a": [1, "x"]}`)}}))
	f.Add(wire.EncodeRequest(wire.Request{ID: &id, Method: wire.MethodCall, Params: wire.CallParams{Method: "run", TimeoutMS: 1}}))
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"tribe.call","params":{"method":"e","timeout_ms":5,"args":null}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"tribe.call","params":{"method":"e","timeout_ms":5,"args":1},"id":2}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"tribe.call","params":{"method":"e","timeout_ms":5,"args":"}}"}}` + " \n"))
	f.Fuzz(func(t *testing.T, line []byte) {
		id, p, ok := wire.ParseCall(line)
		if !ok {
			return
		}
		var req request
		if err := json.Unmarshal(line, &req); err != nil {
			t.Fatalf("ParseCall took %q, Unmarshal refuses it: %v", line, err)
		}
		if req.JSONRPC != "2.0" || req.ID == nil || *req.ID != id || req.Method != wire.MethodCall ||
			req.Params.Method != p.Method || req.Params.TimeoutMS != p.TimeoutMS || !bytes.Equal(req.Params.Args, p.Args) {
			t.Fatalf("%q: ParseCall %d %+v, Unmarshal %+v", line, id, p, req)
		}
	})
}
