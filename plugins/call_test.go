package plugins

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/internal/growbuf"
)

// tableAuth lets the listed callers reach the listed instances; everyone
// else is refused as unauthorized, unknown plugins as not loaded.
type tableAuth struct {
	mu        sync.Mutex
	allowed   map[peer.ID]bool
	instances map[string]*Instance
}

func (a *tableAuth) Authorize(caller peer.ID, req Request) (*Instance, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	in, ok := a.instances[req.Plugin]
	if !ok {
		return nil, Errorf(CodeNotLoaded, "plugin %s is not loaded here", req.Plugin)
	}
	if !a.allowed[caller] {
		return nil, Errorf(CodeUnauthorized, "%s may not call %s here", caller, req.Plugin)
	}
	return in, nil
}

// blocker is a plugin whose calls wait until released or canceled, and
// report how they ended.
type blocker struct {
	started chan struct{}
	release chan struct{}
	ended   chan error
}

func newBlocker() *blocker {
	return &blocker{started: make(chan struct{}, 16), release: make(chan struct{}), ended: make(chan error, 16)}
}

func (*blocker) Name() string      { return "block" }
func (*blocker) Version() string   { return "1" }
func (*blocker) Kind() Kind        { return Processor }
func (*blocker) Methods() []string { return []string{"wait"} }
func (b *blocker) Call(ctx context.Context, _ string, _ json.RawMessage) (json.RawMessage, error) {
	b.started <- struct{}{}
	select {
	case <-b.release:
		b.ended <- nil
		return json.RawMessage(`"released"`), nil
	case <-ctx.Done():
		b.ended <- ctx.Err()
		return nil, ctx.Err()
	}
}

type pair struct {
	caller, callee host.Host
	server         *Server
	auth           *tableAuth
	block          *blocker
}

// newHost is a libp2p host on loopback TCP with opts, closed when the
// test ends.
func newHost(t *testing.T, opts ...libp2p.Option) host.Host {
	t.Helper()
	h, err := libp2p.New(append([]libp2p.Option{libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// newPair connects two real hosts on loopback; the callee serves echo and
// block (concurrency from blockConfig) to the caller.
func newPair(t *testing.T, blockConfig map[string]string) *pair {
	t.Helper()
	p := &pair{caller: newHost(t), callee: newHost(t), block: newBlocker()}
	reg := Builtins(Env{})
	reg.Register("block", func(map[string]string) (Plugin, error) { return p.block, nil })
	echo, err := reg.Load("echo", "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	block, err := reg.Load("block", "t", blockConfig)
	if err != nil {
		t.Fatal(err)
	}
	p.auth = &tableAuth{allowed: map[peer.ID]bool{p.caller.ID(): true}, instances: map[string]*Instance{"echo": echo, "block": block}}
	p.server = NewServer(p.callee, p.auth, slog.New(slog.DiscardHandler))
	p.server.Start()
	t.Cleanup(func() { p.server.Close() })
	if err := p.caller.Connect(context.Background(), peer.AddrInfo{ID: p.callee.ID(), Addrs: p.callee.Addrs()}); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *pair) call(ctx context.Context, req Request) Response {
	return Call(ctx, p.caller, p.callee.ID(), req)
}

func TestCallEcho(t *testing.T) {
	p := newPair(t, nil)
	resp := p.call(context.Background(), Request{ID: "1", Plugin: "echo", Method: "echo", Args: json.RawMessage(`{"x":[1,2]}`)})
	if !resp.OK || string(resp.Result) != `{"x":[1,2]}` || resp.ID != "1" {
		t.Fatalf("echo: %+v", resp)
	}
}

// TestServedReportsCallsRun: WithServed hears of every call a plugin ran,
// with its outcome, and never of a refused one (whose plugin name is the
// caller's to make up).
func TestServedReportsCallsRun(t *testing.T) {
	type served struct {
		plugin string
		code   Code
	}
	var mu sync.Mutex
	var got []served
	reg := Builtins(Env{})
	echo, err := reg.Load("echo", "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	caller := peer.ID("caller")
	auth := &tableAuth{allowed: map[peer.ID]bool{caller: true}, instances: map[string]*Instance{"echo": echo}}
	s := NewServer(nil, auth, slog.New(slog.DiscardHandler), WithServed(func(plugin string, code Code, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if d < 0 {
			t.Errorf("served %s with duration %v", plugin, d)
		}
		got = append(got, served{plugin, code})
	}))
	ctx := context.Background()
	s.Serve(ctx, caller, Request{Plugin: "echo", Method: "echo"})
	s.Serve(ctx, caller, Request{Plugin: "echo", Method: "nope"})
	s.Serve(ctx, caller, Request{Plugin: "made-up", Method: "echo"})
	s.Serve(ctx, peer.ID("stranger"), Request{Plugin: "echo", Method: "echo"})
	want := []served{{"echo", ""}, {"echo", CodeUnknownMethod}}
	if !slices.Equal(got, want) {
		t.Fatalf("served %v, want %v", got, want)
	}
}

func TestCallRefusals(t *testing.T) {
	p := newPair(t, nil)
	stranger := newHost(t)
	stranger.Peerstore().AddAddrs(p.callee.ID(), p.callee.Addrs(), time.Minute)
	for _, c := range []struct {
		name string
		from host.Host
		req  Request
		code Code
	}{
		{"not loaded", p.caller, Request{Plugin: "sys", Method: "collect"}, CodeNotLoaded},
		{"unknown method", p.caller, Request{Plugin: "echo", Method: "nope"}, CodeUnknownMethod},
		{"bad plugin name", p.caller, Request{Plugin: "../x", Method: "echo"}, CodeBadRequest},
		{"caller not allowed", stranger, Request{Plugin: "echo", Method: "echo"}, CodeUnauthorized},
		{"request too large", p.caller, Request{Plugin: "echo", Method: "echo", Args: json.RawMessage(`"` + strings.Repeat("a", MaxRequestSize) + `"`)}, CodeTooLarge},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := Call(context.Background(), c.from, p.callee.ID(), c.req)
			if resp.OK || resp.Code != c.code || resp.Error == "" {
				t.Fatalf("got %+v, want code %s", resp, c.code)
			}
		})
	}
	// Each refusal that reached the callee is counted there by code.
	got := p.server.Refused()
	for _, code := range []Code{CodeNotLoaded, CodeUnknownMethod, CodeBadRequest, CodeUnauthorized} {
		if got[code] != 1 {
			t.Errorf("refused[%s] = %d, want 1 (all: %v)", code, got[code], got)
		}
	}
}

// rawStream sends bytes of the caller's choosing and returns the answer.
func rawStream(t *testing.T, p *pair, send []byte) Response {
	t.Helper()
	st, err := p.caller.NewStream(context.Background(), p.callee.ID(), ProtocolID)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Reset()
	st.Write(send)
	st.CloseWrite()
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, _, err := readFrame(bufio.NewReader(st), MaxResponseSize, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	var resp Response
	if err := json.Unmarshal(f, &resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestMalformedRequests(t *testing.T) {
	p := newPair(t, nil)
	frame := func(b string) []byte {
		return append(binary.AppendUvarint(nil, uint64(len(b))), b...)
	}
	for _, c := range []struct {
		name string
		send []byte
		code Code
	}{
		{"not json", frame("{nope"), CodeBadRequest},
		{"json of the wrong shape", frame(`[1,2,3]`), CodeBadRequest},
		{"negative deadline", frame(`{"plugin":"echo","method":"echo","deadline":-1}`), CodeBadRequest},
		{"length over the limit", binary.AppendUvarint(nil, MaxRequestSize+1), CodeTooLarge},
		{"frame cut short", append(binary.AppendUvarint(nil, 100), "{}"...), CodeBadRequest},
		{"bad varint", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, CodeBadRequest},
		{"nothing at all", nil, CodeBadRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := rawStream(t, p, c.send)
			if resp.OK || resp.Code != c.code {
				t.Fatalf("got %+v, want %s", resp, c.code)
			}
		})
	}
}

// TestRequestNotInTimeIsNotABadRequest: a request that does not come
// whole before the read deadline is counted as timed out, and the stream
// reset without an answer, not answered bad_request.
func TestRequestNotInTimeIsNotABadRequest(t *testing.T) {
	old := readTimeout
	readTimeout = 200 * time.Millisecond
	defer func() { readTimeout = old }()
	p := newPair(t, nil)
	st, err := p.caller.NewStream(context.Background(), p.callee.ID(), ProtocolID)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Reset()
	st.Write(append(binary.AppendUvarint(nil, 100), `{"plugin"`...)) // and no more
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	if f, _, err := readFrame(bufio.NewReader(st), MaxResponseSize, nil); err == nil || isTimeout(err) {
		t.Fatalf("answer %q, err %v; want the stream reset, unanswered", f, err)
	}
	waitUntil(t, "the request counted as timed out", func() bool { return p.server.Refused()[CodeTimeout] == 1 })
	if got := p.server.Refused(); got[CodeBadRequest] != 0 {
		t.Fatalf("refused %v: counted as a bad request", got)
	}
}

func TestDeadlineStopsTheCall(t *testing.T) {
	p := newPair(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	resp := p.call(ctx, Request{Plugin: "block", Method: "wait"})
	if resp.Code != CodeTimeout {
		t.Fatalf("got %+v, want timeout", resp)
	}
	// The callee's plugin saw its context end: the deadline travelled.
	if err := <-p.block.ended; err == nil {
		t.Fatal("the plugin finished normally; want its context ended")
	}
}

func TestCallerCancelsMidCall(t *testing.T) {
	p := newPair(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan Response)
	go func() {
		done <- p.call(ctx, Request{Plugin: "block", Method: "wait", Deadline: time.Minute.Milliseconds()})
	}()
	<-p.block.started
	cancel()
	if resp := <-done; resp.Code != CodeCanceled {
		t.Fatalf("caller got %+v, want canceled", resp)
	}
	select {
	case err := <-p.block.ended:
		if err != context.Canceled {
			t.Fatalf("callee's plugin ended with %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the callee's plugin was not canceled when the caller reset the stream")
	}
}

func TestCalleeCrashesMidCall(t *testing.T) {
	p := newPair(t, nil)
	done := make(chan Response)
	go func() {
		done <- p.call(context.Background(), Request{Plugin: "block", Method: "wait", Deadline: time.Minute.Milliseconds()})
	}()
	<-p.block.started
	p.callee.Close() // the connection dies under the call
	select {
	case resp := <-done:
		if resp.Code != CodeGone {
			t.Fatalf("got %+v, want gone", resp)
		}
	case <-time.After(Silence + 5*time.Second):
		t.Fatal("the caller still waits for a callee that is gone")
	}
}

func TestSilentCalleeIsGivenUp(t *testing.T) {
	old := silence
	silence = 500 * time.Millisecond
	defer func() { silence = old }()
	caller, callee := newHost(t), newHost(t)
	// A callee that reads the request and then says nothing, ever, like
	// one whose connection died without a reset.
	hold := make(chan struct{})
	defer close(hold)
	callee.SetStreamHandler(ProtocolID, func(st network.Stream) {
		io.Copy(io.Discard, st)
		<-hold
		st.Reset()
	})
	caller.Connect(context.Background(), peer.AddrInfo{ID: callee.ID(), Addrs: callee.Addrs()})
	resp := Call(context.Background(), caller, callee.ID(), Request{Plugin: "echo", Method: "echo", Deadline: time.Minute.Milliseconds()})
	if resp.Code != CodeGone || !strings.Contains(resp.Error, "no word") {
		t.Fatalf("got %+v, want gone after silence", resp)
	}
}

func TestHeartbeatsKeepALongCallAlive(t *testing.T) {
	oldS, oldH := silence, heartbeat
	silence, heartbeat = 400*time.Millisecond, 50*time.Millisecond
	defer func() { silence, heartbeat = oldS, oldH }()
	p := newPair(t, nil)
	done := make(chan Response)
	go func() { done <- p.call(context.Background(), Request{Plugin: "block", Method: "wait"}) }()
	<-p.block.started
	time.Sleep(3 * silence) // far longer than the caller tolerates silence
	close(p.block.release)
	if resp := <-done; !resp.OK || string(resp.Result) != `"released"` {
		t.Fatalf("got %+v, want the released answer", resp)
	}
}

func TestConcurrencyLimitRefusesAFlood(t *testing.T) {
	p := newPair(t, map[string]string{"concurrency": "1", "queue": "0"})
	first := make(chan Response, 1)
	go func() {
		first <- p.call(context.Background(), Request{Plugin: "block", Method: "wait", Deadline: time.Minute.Milliseconds()})
	}()
	<-p.block.started
	// The one slot is taken and no call may wait: the next is refused at
	// once, while echo (another plugin) still answers.
	if r := p.call(context.Background(), Request{Plugin: "block", Method: "wait"}); r.Code != CodeBusy {
		t.Fatalf("second call: %+v, want busy", r)
	}
	if r := p.call(context.Background(), Request{Plugin: "echo", Method: "echo"}); !r.OK {
		t.Fatalf("another plugin starved: %+v", r)
	}
	close(p.block.release)
	if r := <-first; !r.OK {
		t.Fatalf("the call within the limit failed: %+v", r)
	}
	if p.server.Refused()[CodeBusy] != 1 {
		t.Fatalf("busy refusals counted: %v", p.server.Refused())
	}
}

func TestQueuedCallWaitsItsTurn(t *testing.T) {
	p := newPair(t, map[string]string{"concurrency": "1", "queue": "4"})
	results := make(chan Response, 2)
	for range 2 {
		go func() {
			results <- p.call(context.Background(), Request{Plugin: "block", Method: "wait", Deadline: time.Minute.Milliseconds()})
		}()
	}
	<-p.block.started
	close(p.block.release) // the first ends, the queued one runs
	for range 2 {
		if r := <-results; !r.OK {
			t.Fatalf("got %+v, want both answered", r)
		}
	}
}

func TestFanOutReportsEveryTarget(t *testing.T) {
	p := newPair(t, nil)
	dead := newHost(t)
	deadID := dead.ID()
	p.caller.Peerstore().AddAddrs(deadID, dead.Addrs(), time.Minute)
	dead.Close()
	targets := []peer.ID{p.callee.ID(), deadID, p.callee.ID()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := map[Code]int{}
	oks := 0
	FanOut(ctx, targets, 2, func(ctx context.Context, id peer.ID) Response {
		return Call(ctx, p.caller, id, Request{Plugin: "echo", Method: "echo", Args: json.RawMessage(`1`)})
	}, func(id peer.ID, r Response) {
		if r.OK {
			oks++
		} else {
			got[r.Code]++
		}
	})
	if oks != 2 || got[CodeUnreachable] != 1 {
		t.Fatalf("ok %d, failures %v; want 2 ok and 1 unreachable", oks, got)
	}
}

// notJSON answers with bytes that are not JSON.
type notJSON struct{}

func (notJSON) Name() string      { return "bad" }
func (notJSON) Version() string   { return "1" }
func (notJSON) Kind() Kind        { return Processor }
func (notJSON) Methods() []string { return []string{"x"} }
func (notJSON) Call(context.Context, string, json.RawMessage) (json.RawMessage, error) {
	return json.RawMessage("{oops"), nil
}

func TestResultThatIsNotJSONFailsTheCall(t *testing.T) {
	p := newPair(t, nil)
	reg := NewRegistry()
	reg.Register("bad", func(map[string]string) (Plugin, error) { return notJSON{}, nil })
	in, err := reg.Load("bad", "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	p.auth.mu.Lock()
	p.auth.instances["bad"] = in
	p.auth.mu.Unlock()
	r := p.call(context.Background(), Request{Plugin: "bad", Method: "x"})
	if r.OK || r.Code != CodeFailed || !strings.Contains(r.Error, "not JSON") {
		t.Fatalf("got %+v", r)
	}
}

func TestCodeKnown(t *testing.T) {
	for _, c := range []Code{CodeBadRequest, CodeTooLarge, CodeUnauthorized, CodeNotLoaded, CodeUnknownMethod, CodeBusy,
		CodeTimeout, CodeCanceled, CodeFailed, CodeUnreachable, CodeGone, CodeBadResponse} {
		if !c.Known() {
			t.Errorf("%s is not Known", c)
		}
	}
	for _, c := range []Code{"", "ok", "made_up", "BUSY"} {
		if c.Known() {
			t.Errorf("%q is Known", c)
		}
	}
}

// TestRequestMemoryBounded: call streams that each announce a request of
// MaxRequestSize and send 3 bytes of it make the callee reserve one 4 KiB
// chunk each on the call protocol's resource scope, and allocate far less
// than the megabyte each announced (before, each took a megabyte at
// once: a few bytes per stream bought a megabyte of the callee's heap).
func TestRequestMemoryBounded(t *testing.T) {
	const streams = 32
	p := newPair(t, nil)
	protocolMemory := func() int64 {
		var m int64
		p.callee.Network().ResourceManager().ViewProtocol(ProtocolID, func(s network.ProtocolScope) error {
			m = s.Stat().Memory
			return nil
		})
		return m
	}
	allocated := func() uint64 {
		s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	before := allocated()
	for range streams {
		st, err := p.caller.NewStream(context.Background(), p.callee.ID(), ProtocolID)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Reset() })
		if _, err := st.Write(append(binary.AppendUvarint(nil, MaxRequestSize), "abc"...)); err != nil {
			t.Fatal(err)
		}
	}
	want := int64(streams * growbuf.Chunk)
	deadline := time.Now().Add(10 * time.Second)
	for protocolMemory() != want {
		if time.Now().After(deadline) {
			t.Fatalf("the call protocol's scope holds %d bytes, want %d (a chunk per stream)", protocolMemory(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	grew := allocated() - before
	t.Logf("%d streams announcing %d MiB each: %.1f MiB allocated in all", streams, MaxRequestSize>>20, float64(grew)/(1<<20))
	if grew > streams*MaxRequestSize/4 {
		t.Fatalf("%d MiB allocated for %d streams that sent 3 bytes each", grew>>20, streams)
	}
}
