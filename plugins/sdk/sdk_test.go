package sdk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tribeagent/tribe/internal/syncbuf"
	"github.com/tribeagent/tribe/plugins/external/wire"
)

type impl struct{}

func (impl) Add(ctx context.Context, a struct{ X, Y int }) (int, error) { return a.X + a.Y, nil }
func (impl) Boom(ctx context.Context, _ json.RawMessage) (string, error) {
	panic("boom")
}
func (impl) Fail(ctx context.Context, _ json.RawMessage) (string, error) {
	return "half", errors.New("failed")
}
func (impl) Mute(ctx context.Context, _ json.RawMessage) (string, error) {
	return "", errors.New("")
}
func (impl) NotAMethod(x int) int { return x } // wrong shape: not a plugin method

// Serve answers each request in the protocol: the handshake lists the
// methods, calls decode their arguments strictly, a panic or an error is
// a failed call (with the output so far), unknown methods are refused,
// and shutdown is answered last.
func TestServe(t *testing.T) {
	in := strings.Join([]string{
		`{"jsonrpc":"2.0","id":0,"method":"tribe.handshake","params":{"protocol":1}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tribe.call","params":{"method":"add","args":{"X":2,"Y":3},"timeout_ms":1000}}`,
		`{"jsonrpc":"2.0","id":2,"method":"tribe.call","params":{"method":"add","args":{"Z":1},"timeout_ms":1000}}`,
		`{"jsonrpc":"2.0","id":3,"method":"tribe.call","params":{"method":"boom","timeout_ms":1000}}`,
		`{"jsonrpc":"2.0","id":4,"method":"tribe.call","params":{"method":"fail","timeout_ms":1000}}`,
		`{"jsonrpc":"2.0","id":5,"method":"tribe.call","params":{"method":"nope","timeout_ms":1000}}`,
		`{"jsonrpc":"2.0","id":8,"method":"tribe.call","params":{"method":"mute","timeout_ms":1000}}`,
		`not json`,
		`{"jsonrpc":"2.0","id":6,"method":"tribe.shutdown"}`,
		`{"jsonrpc":"2.0","id":7,"method":"tribe.call","params":{"method":"add","args":{"X":1},"timeout_ms":1000}}`,
	}, "\n") + "\n"
	var out bytes.Buffer
	if err := Serve(Info{Name: "t", Version: "1", Kind: "processor"}, impl{}, strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	got := map[int64]wire.Response{}
	var order []int64
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		r, err := wire.DecodeResponse([]byte(line))
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		got[r.ID], order = r, append(order, r.ID)
	}
	info, err := wire.DecodeInfo(got[0].Result, "t")
	if err != nil || strings.Join(info.Methods, ",") != "add,boom,fail,mute" {
		t.Fatalf("handshake: %+v %v", info, err)
	}
	if string(got[1].Result) != "5" {
		t.Errorf("add: %+v", got[1])
	}
	for id, want := range map[int64]string{2: `unknown field "Z"`, 3: "panicked: boom", 4: "failed", 5: `no method "nope"`} {
		if got[id].Error == nil || !strings.Contains(got[id].Error.Message, want) {
			t.Errorf("%d: %+v, want an error saying %q", id, got[id], want)
		}
	}
	// An error with no text is answered with one (the agent once took
	// the answer for garbage, and the call waited out its deadline).
	if !strings.Contains(out.String(), `"id":8,"error":{"code":1,"message":"`+wire.NoMessage+`"`) {
		t.Errorf("an error with no message: %s", out.String())
	}
	if string(got[4].Error.Data) != `"half"` {
		t.Errorf("a failed call's output: %s", got[4].Error.Data)
	}
	if _, ok := got[7]; ok || order[len(order)-1] != 6 {
		t.Errorf("answers after shutdown, or shutdown not last: %v", order)
	}
}

// Calls run concurrently on workers: ten calls that each wait for all
// ten to have started all finish, twice (the second time partly on the
// workers the first left idle); then no more than maxIdleWorkers stay,
// and all of them end with the server.
func TestWorkersRunCallsConcurrently(t *testing.T) {
	s := &server{work: make(chan func()), quit: make(chan struct{})}
	for range 2 {
		const n = 10
		var started, finished sync.WaitGroup
		started.Add(n)
		finished.Add(n)
		for range n {
			s.run(func() {
				started.Done()
				started.Wait() // all n at once, or this never returns
				finished.Done()
			})
		}
		finished.Wait()
	}
	for deadline := time.Now().Add(time.Minute); s.idle.Load() != maxIdleWorkers; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle workers a minute after the calls, want %d", s.idle.Load(), maxIdleWorkers)
		}
	}
	close(s.quit)
	s.wg.Wait()
	if got := s.idle.Load(); got != 0 {
		t.Fatalf("%d idle workers after the server ended", got)
	}
}

type echoImpl struct{}

func (echoImpl) Echo(ctx context.Context, args json.RawMessage) (json.RawMessage, error) {
	return args, nil
}

// A request longer than the reader's buffer (64 KiB) is read whole, and
// the request after it too.
func TestServeReadsALongLine(t *testing.T) {
	long := `"` + strings.Repeat("x", 200<<10) + `"`
	id := int64(1)
	in := string(wire.EncodeRequest(wire.Request{ID: &id, Method: wire.MethodCall, Params: wire.CallParams{Method: "echo", TimeoutMS: 1000, Args: json.RawMessage(long)}})) +
		`{"jsonrpc":"2.0","id":2,"method":"tribe.call","params":{"method":"echo","args":[2],"timeout_ms":1000}}` + "\n"
	var out bytes.Buffer
	if err := Serve(Info{Name: "t", Version: "1", Kind: "processor"}, echoImpl{}, strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	got := map[int64]string{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		r, err := wire.DecodeResponse([]byte(line))
		if err != nil {
			t.Fatalf("%.80q: %v", line, err)
		}
		got[r.ID] = string(r.Result)
	}
	if got[1] != long || got[2] != "[2]" {
		t.Fatalf("answers: %d bytes for 1, %q for 2", len(got[1]), got[2])
	}
}

type waitImpl struct{ echoImpl }

// Wait returns when its call ends (the agent cancels it).
func (waitImpl) Wait(ctx context.Context, _ json.RawMessage) (string, error) {
	<-ctx.Done()
	return "", ctx.Err()
}

// A call in progress holds up no other request: while one waits, the next
// call is read and answered, and a cancel reaches the waiting one.
func TestCallsDoNotHoldUpReading(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	errc := make(chan error, 1)
	go func() { errc <- Serve(Info{Name: "t", Version: "1", Kind: "processor"}, waitImpl{}, inR, outW) }()
	answers := bufio.NewScanner(outR)
	next := func() wire.Response {
		if !answers.Scan() {
			t.Fatalf("no answer: %v", answers.Err())
		}
		r, err := wire.DecodeResponse(answers.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	send := func(line string) {
		if _, err := io.WriteString(inW, line+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"tribe.call","params":{"method":"wait","timeout_ms":60000}}`)
	send(`{"jsonrpc":"2.0","id":2,"method":"tribe.call","params":{"method":"echo","timeout_ms":60000,"args":[2]}}`)
	if r := next(); r.ID != 2 || string(r.Result) != "[2]" {
		t.Fatalf("first answer %+v, want echo's (2) while wait (1) runs", r)
	}
	send(`{"jsonrpc":"2.0","method":"tribe.cancel","params":{"id":1}}`)
	if r := next(); r.ID != 1 || r.Error == nil || !strings.Contains(r.Error.Message, "canceled") {
		t.Fatalf("after the cancel: %+v, want wait (1) cancelled", r)
	}
	inW.Close()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// A json.RawMessage result with line breaks goes out on one line: the
// protocol's messages are lines.
func TestRawResultOnOneLine(t *testing.T) {
	for _, res := range []string{"{\n  \"a\": [1,\r\n 2]\n}", `"x"`} {
		out, err := encode(json.RawMessage(res))
		if err != nil || bytes.ContainsAny(out, "\r\n") {
			t.Fatalf("%q encoded as %q, %v", res, out, err)
		}
		var a, b any
		json.Unmarshal([]byte(res), &a)
		json.Unmarshal(out, &b)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%q encoded as %q", res, out)
		}
	}
}

// At the end of its input the plugin cancels the calls still running and
// returns, also when the first request it read is such a call.
func TestEndOfInputCancelsCalls(t *testing.T) {
	inR, inW := io.Pipe()
	var out syncbuf.Buffer
	errc := make(chan error, 1)
	go func() { errc <- Serve(Info{Name: "t", Version: "1", Kind: "processor"}, waitImpl{}, inR, &out) }()
	io.WriteString(inW, `{"jsonrpc":"2.0","id":1,"method":"tribe.call","params":{"method":"wait","timeout_ms":600000}}`+"\n")
	inW.Close()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Serve still runs a minute after its input ended: the call was not cancelled")
	}
	r, err := wire.DecodeResponse([]byte(strings.TrimSpace(out.String())))
	if err != nil || r.ID != 1 || r.Error == nil || !strings.Contains(r.Error.Message, "canceled") {
		t.Fatalf("the call's answer: %+v %v, want cancelled", r, err)
	}
}
