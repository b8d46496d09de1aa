package sdk

import (
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/tribeagent/tribe/plugins/external/wire"
)

// BenchmarkHandleCall: the SDK's own work for one call (decode, run,
// answer), without the pipe: its allocations are most of what a call to
// an idle plugin costs above the pipe's wake-ups.
func BenchmarkHandleCall(b *testing.B) {
	ms, _ := methods(echoImpl{})
	s := &server{info: Info{Name: "t"}, methods: ms, out: io.Discard, running: map[int64]*callCtx{},
		work: make(chan func()), quit: make(chan struct{})}
	id := int64(7)
	line := wire.EncodeRequest(wire.Request{ID: &id, Method: wire.MethodCall, Params: wire.CallParams{Method: "echo", TimeoutMS: 30000, Args: json.RawMessage(`"` + strings.Repeat("x", 98) + `"`)}})
	b.ReportAllocs()
	for b.Loop() {
		call, _ := s.handle(line)
		call.run()
	}
}
