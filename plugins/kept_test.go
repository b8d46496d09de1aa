package plugins

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
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
	oldIdle, oldKept := streamIdle, keptIdle
	streamIdle, keptIdle = 50*time.Millisecond, time.Hour // the wrong way round, on purpose
	defer func() { streamIdle, keptIdle = oldIdle, oldKept }()
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
	old := keptIdle
	keptIdle = 20 * time.Millisecond
	defer func() { keptIdle = old }()
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
	st.SetReadDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(st)
	for {
		f, err := readFrame(br, MaxResponseSize)
		if err != nil {
			if errors.Is(err, io.EOF) {
				t.Fatal("the stream was closed cleanly, want reset")
			}
			break // reset
		}
		if len(f) > 0 {
			t.Fatalf("an answer on a broken stream: %s", f)
		}
	}
}

// Closing the server does not wait for kept streams to go idle.
func TestServerCloseEndsIdleStreams(t *testing.T) {
	old := streamIdle
	streamIdle = time.Hour
	defer func() { streamIdle = old }()
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
