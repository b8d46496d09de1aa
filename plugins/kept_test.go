package plugins

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// callStreams are the caller's open streams of the call protocol to the
// callee.
func (p *pair) callStreams() []network.Stream {
	var out []network.Stream
	for _, c := range p.caller.Network().ConnsToPeer(p.callee.ID()) {
		for _, st := range c.GetStreams() {
			if st.Protocol() == ProtocolID {
				out = append(out, st)
			}
		}
	}
	return out
}

// setFor sets *v to d for the test: restored after everything the test
// registers later (a pair's server, whose streams read it) has closed.
func setFor(t *testing.T, v *time.Duration, d time.Duration) {
	old := *v
	*v = d
	t.Cleanup(func() { *v = old })
}

// waitUntil polls cond until it holds, failing after a minute.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
	}
}

func echoed(t *testing.T, resp Response) {
	t.Helper()
	if !resp.OK || string(resp.Result) != `"x"` {
		t.Fatalf("echo: %+v", resp)
	}
}

var echoX = Request{Plugin: "echo", Method: "echo", Args: json.RawMessage(`"x"`)}

// A Caller's second call to a callee goes on the stream of the first.
func TestKeptStreamCarriesTheNextCall(t *testing.T) {
	p := newPair(t, nil)
	c := NewCaller(p.caller, 8)
	defer c.Close()
	ctx := context.Background()
	echoed(t, c.Call(ctx, p.callee.ID(), echoX))
	first := p.callStreams()
	if len(first) != 1 {
		t.Fatalf("%d call streams open after a call, want the one kept", len(first))
	}
	for range 3 {
		echoed(t, c.Call(ctx, p.callee.ID(), echoX))
	}
	if now := p.callStreams(); len(now) != 1 || now[0].ID() != first[0].ID() {
		t.Fatalf("after three more calls: %d streams, want the first one still", len(now))
	}
	c.Drop(p.callee.ID())
	waitUntil(t, "the dropped stream to close", func() bool { return len(p.callStreams()) == 0 })
}

// A stream the callee closed while it was kept (idle longer than the
// callee keeps one) is replaced by a new one, and the call runs once.
func TestKeptStreamClosedByCalleeIsReplaced(t *testing.T) {
	setFor(t, &streamIdle, 50*time.Millisecond)
	setFor(t, &keptIdle, time.Hour) // the wrong way round, on purpose
	p := newPair(t, nil)
	close(p.block.release) // block's calls return at once, counted in started
	c := NewCaller(p.caller, 8)
	defer c.Close()
	ctx := context.Background()
	wait := Request{Plugin: "block", Method: "wait"}
	if resp := c.Call(ctx, p.callee.ID(), wait); !resp.OK {
		t.Fatalf("first call: %+v", resp)
	}
	calleeStreams := func() int {
		n := 0
		for _, cn := range p.callee.Network().ConnsToPeer(p.caller.ID()) {
			for _, st := range cn.GetStreams() {
				if st.Protocol() == ProtocolID {
					n++
				}
			}
		}
		return n
	}
	waitUntil(t, "the callee to close the idle stream", func() bool { return calleeStreams() == 0 })
	if n := len(p.callStreams()); n != 1 {
		t.Fatalf("%d streams kept by the caller, want the one the callee closed", n)
	}
	if resp := c.Call(ctx, p.callee.ID(), wait); !resp.OK {
		t.Fatalf("call after the callee closed the kept stream: %+v", resp)
	}
	if n := len(p.block.started); n != 2 {
		t.Fatalf("the plugin ran %d times for 2 calls", n)
	}
}

// A kept stream idle for keptIdle is not used again: the next call opens
// a new one, and the old one is closed.
func TestKeptStreamExpires(t *testing.T) {
	setFor(t, &keptIdle, 20*time.Millisecond)
	p := newPair(t, nil)
	c := NewCaller(p.caller, 8)
	defer c.Close()
	ctx := context.Background()
	echoed(t, c.Call(ctx, p.callee.ID(), echoX))
	first := p.callStreams()[0].ID()
	time.Sleep(2 * keptIdle)
	echoed(t, c.Call(ctx, p.callee.ID(), echoX))
	now := p.callStreams()
	if len(now) != 1 || now[0].ID() == first {
		t.Fatalf("after keptIdle: %d streams (the first one among them: %v), want only a new one", len(now), len(now) > 0 && now[0].ID() == first)
	}
}

// A caller that sends anything while its call runs breaks the protocol:
// the callee resets the stream and cancels the call.
func TestRequestDuringACallResetsTheStream(t *testing.T) {
	p := newPair(t, nil)
	st, err := p.caller.NewStream(context.Background(), p.callee.ID(), ProtocolID)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Reset()
	frame := func(r Request) []byte {
		b, _ := json.Marshal(r)
		return append(binary.AppendUvarint(nil, uint64(len(b))), b...)
	}
	st.Write(frame(Request{ID: "1", Plugin: "block", Method: "wait", Deadline: time.Minute.Milliseconds()}))
	<-p.block.started
	time.Sleep(2 * watchAfter) // past the point where the callee watches the stream
	st.Write(frame(Request{ID: "2", Plugin: "echo", Method: "echo"}))
	select {
	case err := <-p.block.ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the running call ended with %v, want canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the running call was not canceled")
	}
	waitUntil(t, "the broken protocol to be counted", func() bool { return p.server.Refused()[CodeBadRequest] == 1 })
	st.SetReadDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(st)
	for {
		f, _, err := readFrame(br, MaxResponseSize, nil)
		if err != nil {
			if !errors.Is(err, network.ErrReset) {
				t.Fatalf("the stream ended with %v, want reset", err)
			}
			break
		}
		if len(f) > 0 {
			t.Fatalf("an answer on a broken stream: %s", f)
		}
	}
}

// Closing the server does not wait for kept streams to go idle.
func TestServerCloseEndsIdleStreams(t *testing.T) {
	setFor(t, &streamIdle, time.Hour)
	p := newPair(t, nil)
	c := NewCaller(p.caller, 8)
	defer c.Close()
	echoed(t, c.Call(context.Background(), p.callee.ID(), echoX))
	done := make(chan struct{})
	go func() { p.server.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Close waited for a kept stream's idle hour")
	}
}

// keptSet's bounds and order, with times given.
func TestKeptSet(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const idle = 10 * time.Second
	a, b := peer.ID("a"), peer.ID("b")
	s := func(p peer.ID, used time.Duration) *callStream { return &callStream{peer: p, used: t0.Add(used)} }
	k := newKeptSet(3, 2)
	a1, a2, a3, b1 := s(a, 0), s(a, time.Second), s(a, 2*time.Second), s(b, 3*time.Second)
	for _, c := range []struct {
		cs   *callStream
		kept bool
	}{{a1, true}, {a2, true}, {a3, false /* two to a already */}, {b1, true}} {
		if kept, _ := k.put(c.cs, t0.Add(4*time.Second), idle); kept != c.kept {
			t.Fatalf("put %v: kept %v, want %v", c.cs.used, kept, c.kept)
		}
	}
	// Full: a fourth is refused while none has expired...
	if kept, gone := k.put(s(peer.ID("c"), 5*time.Second), t0.Add(5*time.Second), idle); kept || len(gone) != 0 {
		t.Fatalf("put into a full set: kept %v, expired %d", kept, len(gone))
	}
	// ...and kept once a1 has (the set drops the expired to make room).
	if kept, gone := k.put(s(peer.ID("c"), 10*time.Second), t0.Add(10*time.Second), idle); !kept || len(gone) != 1 || gone[0] != a1 {
		t.Fatalf("put once a1 expired: kept %v, expired %v", kept, gone)
	}
	// take gives the most recently used stream to a peer.
	if got, gone := k.take(a, t0.Add(10*time.Second), idle); got != a2 || len(gone) != 0 {
		t.Fatalf("take a: %v, %v; want a2", got, gone)
	}
	if got, _ := k.take(a, t0.Add(10*time.Second), idle); got != nil {
		t.Fatalf("take a again: %v, want none left", got)
	}
	// A peer whose newest stream expired has all expired: all are closed.
	k.put(s(a, 11*time.Second), t0.Add(11*time.Second), idle)
	if got, gone := k.take(a, t0.Add(30*time.Second), idle); got != nil || len(gone) != 1 {
		t.Fatalf("take an expired one: %v, %d to close", got, len(gone))
	}
	if gone := k.dropAll(); len(gone) != 2 || k.n != 0 {
		t.Fatalf("dropAll: %d, n %d; want b1 and c, and none left", len(gone), k.n)
	}
}

// dropper is a plugin whose first run closes the callee's connection to
// the caller (as its connection manager may, or a command that restarts
// the agent) before it answers.
type dropper struct {
	runs  atomic.Int32
	close func()
}

func (*dropper) Name() string      { return "drop" }
func (*dropper) Version() string   { return "1" }
func (*dropper) Kind() Kind        { return Processor }
func (*dropper) Methods() []string { return []string{"run", "noop"} }
func (d *dropper) Call(ctx context.Context, m string, _ json.RawMessage) (json.RawMessage, error) {
	if m == "noop" {
		return json.RawMessage(`1`), nil
	}
	if d.runs.Add(1) == 1 {
		d.close()
	}
	return json.RawMessage(`1`), nil
}

// A call the callee read on a kept stream, whose connection then closed
// before any answer, is gone: it is not sent again on a new stream (the
// reset's error wraps io.EOF, which a callee's clean close of an unread
// stream also is).
func TestCallReadThenCutIsNotSentAgain(t *testing.T) {
	caller, callee := newHost(t), newHost(t)
	d := &dropper{close: func() { callee.Network().ClosePeer(caller.ID()) }}
	reg := Builtins(Env{})
	reg.Register("drop", func(map[string]string) (Plugin, error) { return d, nil })
	inst, err := reg.Load("drop", "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	auth := &tableAuth{allowed: map[peer.ID]bool{caller.ID(): true}, instances: map[string]*Instance{"drop": inst}}
	s := NewServer(callee, auth, slog.New(slog.DiscardHandler))
	s.Start()
	t.Cleanup(func() { s.Close() })
	if err := caller.Connect(context.Background(), peer.AddrInfo{ID: callee.ID(), Addrs: callee.Addrs()}); err != nil {
		t.Fatal(err)
	}
	c := NewCaller(caller, 8)
	defer c.Close()
	if r := c.Call(context.Background(), callee.ID(), Request{Plugin: "drop", Method: "noop"}); !r.OK {
		t.Fatal(r)
	}
	r := c.Call(context.Background(), callee.ID(), Request{Plugin: "drop", Method: "run"})
	if n := d.runs.Load(); n != 1 || r.Code != CodeGone {
		t.Fatalf("the call ran %d times and answered %+v; want once, and gone", n, r)
	}
}

// A Caller keeps at most keptPerPeer streams to one callee: three calls
// at once leave two kept.
func TestCallerKeepsAtMostPerPeer(t *testing.T) {
	p := newPair(t, map[string]string{"concurrency": "3"})
	c := NewCaller(p.caller, 8)
	defer c.Close()
	done := make(chan Response, 3)
	for range 3 {
		go func() { done <- c.Call(context.Background(), p.callee.ID(), Request{Plugin: "block", Method: "wait"}) }()
	}
	for range 3 {
		<-p.block.started
	}
	close(p.block.release)
	for range 3 {
		if r := <-done; !r.OK {
			t.Fatal(r)
		}
	}
	waitUntil(t, "the third stream to close", func() bool { return len(p.callStreams()) == keptPerPeer })
}

// A call that was canceled, or refused, or carried more than KeptFrame
// does not leave its stream kept.
func TestStreamsNotKept(t *testing.T) {
	p := newPair(t, nil)
	c := NewCaller(p.caller, 8)
	defer c.Close()
	ctx := context.Background()
	echoed(t, c.Call(ctx, p.callee.ID(), echoX)) // one kept, reused below
	cctx, cancel := context.WithCancel(ctx)
	go func() { <-p.block.started; cancel() }()
	if r := c.Call(cctx, p.callee.ID(), Request{Plugin: "block", Method: "wait"}); r.Code != CodeCanceled {
		t.Fatalf("canceled call: %+v", r)
	}
	waitUntil(t, "the canceled call's stream to go", func() bool { return len(p.callStreams()) == 0 })
	big := json.RawMessage(`"` + strings.Repeat("x", KeptFrame) + `"`)
	if r := c.Call(ctx, p.callee.ID(), Request{Plugin: "echo", Method: "echo", Args: big}); !r.OK {
		t.Fatalf("big echo: %+v", r)
	}
	waitUntil(t, "the big call's stream to close", func() bool { return len(p.callStreams()) == 0 })
	p.auth.mu.Lock()
	delete(p.auth.allowed, p.caller.ID())
	p.auth.mu.Unlock()
	if r := c.Call(ctx, p.callee.ID(), echoX); r.Code != CodeUnauthorized {
		t.Fatalf("refused call: %+v", r)
	}
	waitUntil(t, "the refused call's stream to close", func() bool { return len(p.callStreams()) == 0 })
}

// A callee keeps at most maxIdlePerCaller of one caller's streams open
// waiting for a next call, and closes a refused caller's stream at once.
func TestCalleeBoundsIdleStreams(t *testing.T) {
	setFor(t, &streamIdle, time.Hour)
	p := newPair(t, nil)
	frame := func(r Request) []byte {
		b, _ := json.Marshal(r)
		return append(binary.AppendUvarint(nil, uint64(len(b))), b...)
	}
	// open calls on a raw stream and reads the answer; then reports
	// whether the callee closed the stream within wait.
	open := func(r Request, wait time.Duration) (Response, bool) {
		st, err := p.caller.NewStream(context.Background(), p.callee.ID(), ProtocolID)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Reset() })
		st.Write(frame(r))
		br := bufio.NewReader(st)
		st.SetReadDeadline(time.Now().Add(time.Minute))
		f, _, err := readFrame(br, MaxResponseSize, nil)
		if err != nil {
			t.Fatal(err)
		}
		var resp Response
		json.Unmarshal(f, &resp)
		st.SetReadDeadline(time.Now().Add(wait))
		_, err = br.Peek(1)
		return resp, err == io.EOF
	}
	for i := range maxIdlePerCaller {
		if r, closed := open(echoX, 200*time.Millisecond); !r.OK || closed {
			t.Fatalf("stream %d: %+v, closed %v; want answered and kept open", i, r, closed)
		}
	}
	if r, closed := open(echoX, time.Minute); !r.OK || !closed {
		t.Fatalf("one stream past the bound: %+v, closed %v; want answered and closed", r, closed)
	}
	if r, closed := open(Request{Plugin: "nope", Method: "echo"}, time.Minute); r.Code != CodeNotLoaded || !closed {
		t.Fatalf("a refused call: %+v, closed %v; want not_loaded and closed", r, closed)
	}
}

// Kept streams idle for keptIdle are closed without waiting for another
// call.
func TestKeptStreamsAreSwept(t *testing.T) {
	setFor(t, &keptIdle, 20*time.Millisecond)
	p := newPair(t, nil)
	c := NewCaller(p.caller, 8)
	defer c.Close()
	echoed(t, c.Call(context.Background(), p.callee.ID(), echoX))
	waitUntil(t, "the kept stream to be swept", func() bool { return len(p.callStreams()) == 0 })
}
