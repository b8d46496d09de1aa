package plugins

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/quic-go/quic-go"
)

// stallProxy stands between a caller and a callee on loopback: the first
// stall connections it accepts it holds open and silent, as a host too
// busy to answer its handshake would; the ones after are relayed to to.
type stallProxy struct {
	ln       net.Listener
	to       string
	mu       sync.Mutex
	stall    int
	accepted int
	held     []net.Conn
}

func newStallProxy(t *testing.T, to string, stall int) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, to: to, stall: stall}
	t.Cleanup(p.close)
	go p.serve()
	return p
}

func (p *stallProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.accepted++
		stall := p.accepted <= p.stall
		if stall {
			p.held = append(p.held, c)
		}
		p.mu.Unlock()
		if !stall {
			go relay(c, p.to)
		}
	}
}

func relay(c net.Conn, to string) {
	d, err := net.Dial("tcp", to)
	if err != nil {
		c.Close()
		return
	}
	go func() { io.Copy(d, c); d.Close() }()
	io.Copy(c, d)
	c.Close()
}

func (p *stallProxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

func (p *stallProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.held {
		c.Close()
	}
}

// quickDialer is a caller whose dials on loopback give up after 300 ms
// (5 s by default), so that a stalled dial times out quickly.
func quickDialer(t *testing.T) host.Host {
	t.Helper()
	return newHost(t, libp2p.SwarmOpts(swarm.WithDialTimeout(300*time.Millisecond), swarm.WithDialTimeoutLocal(300*time.Millisecond)))
}

// tcpAddr is h's TCP address on loopback as HOST:PORT.
func tcpAddr(t *testing.T, h host.Host) string {
	t.Helper()
	for _, a := range h.Addrs() {
		if ip, err := a.ValueForProtocol(ma.P_IP4); err == nil {
			if port, err := a.ValueForProtocol(ma.P_TCP); err == nil {
				return net.JoinHostPort(ip, port)
			}
		}
	}
	t.Fatalf("%s has no TCP address", h.ID())
	return ""
}

// echoCallee is a host serving echo to caller.
func echoCallee(t *testing.T, caller peer.ID) host.Host {
	t.Helper()
	h := newHost(t)
	echo, err := Builtins(Env{}).Load("echo", "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	auth := &tableAuth{allowed: map[peer.ID]bool{caller: true}, instances: map[string]*Instance{"echo": echo}}
	s := NewServer(h, auth, slog.New(slog.DiscardHandler))
	s.Start()
	t.Cleanup(func() { s.Close() })
	return h
}

// fanOutOne fans one call out to p through c, and returns its answer and
// how many times FanOut made it again.
func fanOutOne(ctx context.Context, c *Caller, p peer.ID) (Response, int) {
	var got Response
	again := FanOut(ctx, []peer.ID{p}, 4, func(ctx context.Context, p peer.ID) Response {
		return c.Call(ctx, p, Request{ID: "1", Plugin: "echo", Method: "echo", Args: json.RawMessage(`{"ping":1}`)})
	}, func(_ peer.ID, r Response) { got = r })
	return got, again
}

// behindProxy makes an echo callee that caller knows only at the address
// of a stallProxy (stall connections held silent), and returns both.
func behindProxy(t *testing.T, caller host.Host, stall int) (host.Host, *stallProxy) {
	t.Helper()
	callee := echoCallee(t, caller.ID())
	proxy := newStallProxy(t, tcpAddr(t, callee), stall)
	caller.Peerstore().AddAddr(callee.ID(), ma.StringCast("/ip4/127.0.0.1/tcp/"+port(proxy.ln)), time.Hour)
	return callee, proxy
}

// TestCallDialsAgainAfterADialTimedOut: a callee whose first two
// connections are never answered (a host too busy to finish a handshake
// before the dial's deadline) is dialled again within the call's
// deadline, and answers; each call made again is counted.
func TestCallDialsAgainAfterADialTimedOut(t *testing.T) {
	defer shortRetries()()
	caller := quickDialer(t)
	callee, proxy := behindProxy(t, caller, 2)
	c := NewCaller(caller, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, again := fanOutOne(ctx, c, callee.ID())
	if !resp.OK || string(resp.Result) != `{"ping":1}` {
		t.Fatalf("call through a callee that let two dials time out: %+v", resp)
	}
	if got := proxy.connections(); got != 3 {
		t.Fatalf("%d connections reached the callee's address, want 3 (two timed out, then the call's)", got)
	}
	if again != 2 {
		t.Fatalf("FanOut made the call again %d times, want 2", again)
	}
}

// TestCallDialTimedOutUntilTheDeadline: a callee that never answers is
// dialled again until the call's deadline, and the call ends unreachable
// or timed out then, not before.
func TestCallDialTimedOutUntilTheDeadline(t *testing.T) {
	defer shortRetries()()
	caller := quickDialer(t)
	callee, proxy := behindProxy(t, caller, 1<<30)
	c := NewCaller(caller, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, again := fanOutOne(ctx, c, callee.ID())
	if resp.OK || (resp.Code != CodeTimeout && resp.Code != CodeUnreachable) || ctx.Err() == nil {
		t.Fatalf("call to a callee that never answers: %+v (context: %v), want it failed at the deadline", resp, ctx.Err())
	}
	if proxy.connections() < 2 || again < 1 {
		t.Fatalf("%d connections, made again %d times: the dial was not tried again", proxy.connections(), again)
	}
}

// TestCallRefusedIsNotDialledAgain: an address where nothing listens
// refuses the connection; that is final, and the call says unreachable
// at once instead of waiting out its deadline.
func TestCallRefusedIsNotDialledAgain(t *testing.T) {
	defer shortRetries()()
	caller := quickDialer(t)
	callee := echoCallee(t, caller.ID())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := port(ln)
	ln.Close()
	caller.Peerstore().AddAddr(callee.ID(), ma.StringCast("/ip4/127.0.0.1/tcp/"+closed), time.Hour)
	c := NewCaller(caller, 4)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, again := fanOutOne(ctx, c, callee.ID())
	if resp.Code != CodeUnreachable || ctx.Err() != nil {
		t.Fatalf("call to a closed port: %+v (context: %v), want %s before the deadline", resp, ctx.Err(), CodeUnreachable)
	}
	if again != 0 {
		t.Fatalf("made again %d times after a refusal, want 0", again)
	}
}

// TestRetryHoldsNoSlot: while one target's call waits to be made again,
// its slot goes to the next target: with one slot, a target behind one
// that never answers is answered long before the deadline.
func TestRetryHoldsNoSlot(t *testing.T) {
	defer shortRetries()()
	caller := quickDialer(t)
	stalled, _ := behindProxy(t, caller, 1<<30)
	fine := echoCallee(t, caller.ID())
	caller.Peerstore().AddAddrs(fine.ID(), fine.Addrs(), time.Hour)
	c := NewCaller(caller, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var mu sync.Mutex
	answered := map[peer.ID]error{}
	FanOut(ctx, []peer.ID{stalled.ID(), fine.ID()}, 1, func(ctx context.Context, p peer.ID) Response {
		return c.Call(ctx, p, Request{ID: "1", Plugin: "echo", Method: "echo"})
	}, func(p peer.ID, r Response) {
		mu.Lock()
		defer mu.Unlock()
		answered[p] = ctx.Err()
		if p == fine.ID() && !r.OK {
			t.Errorf("the target behind a stalled one: %+v", r)
		}
	})
	if err, ok := answered[fine.ID()]; !ok || err != nil {
		t.Fatalf("the target behind a stalled one was answered after the deadline (%v), or never (%v)", err, ok)
	}
}

func TestDialWindow(t *testing.T) {
	w := newDialWindow()
	ctx := context.Background()
	for range maxDials {
		if err := w.acquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := w.acquire(short); err == nil {
		t.Fatalf("a dial past the window (%d) did not wait", maxDials)
	}
	// A timeout halves the window: 63 in flight, 32 allowed.
	w.release(true)
	if w.limit != maxDials/2 {
		t.Fatalf("window %d after a timeout, want %d", w.limit, maxDials/2)
	}
	for range 10 {
		w.release(true)
	}
	if w.limit != minDials {
		t.Fatalf("window %d after many timeouts, want the floor %d", w.limit, minDials)
	}
	// 53 in flight: releases without a timeout widen it by one each.
	for range 48 {
		w.release(false)
	}
	if w.limit != minDials+48 || w.inFlight != 5 {
		t.Fatalf("window %d with %d in flight after 48 dials done, want %d and 5", w.limit, w.inFlight, minDials+48)
	}
	// Filled again, one more dial waits until a dial ends.
	for range minDials + 48 - 5 {
		w.acquire(ctx)
	}
	got := make(chan error, 1)
	go func() { got <- w.acquire(ctx) }()
	select {
	case err := <-got:
		t.Fatalf("acquired past a full window: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	w.release(false)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

func TestDialTimedOut(t *testing.T) {
	p, _ := peer.Decode("12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA")
	a := ma.StringCast("/ip4/10.0.0.1/tcp/4001")
	dialErr := func(causes ...error) error {
		e := &swarm.DialError{Peer: p, Cause: swarm.ErrAllDialsFailed}
		for _, c := range causes {
			e.DialErrors = append(e.DialErrors, swarm.TransportError{Address: a, Cause: c})
		}
		return e
	}
	timedOut := &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"a connect that timed out", dialErr(timedOut), true},
		{"a handshake past its deadline", dialErr(fmt.Errorf("failed to negotiate security protocol: %w", context.DeadlineExceeded)), true},
		{"one address refused, one timed out", dialErr(refused, timedOut), true},
		{"refused", dialErr(refused), false},
		{"dial backoff", swarm.ErrDialBackoff, false},
		{"no addresses", swarm.ErrNoAddresses, false},
		{"a resource limit", fmt.Errorf("%w: %w", network.ErrResourceLimitExceeded, context.DeadlineExceeded), false},
	} {
		if got := dialTimedOut(c.err); got != c.want {
			t.Errorf("%s: dialTimedOut = %v, want %v", c.name, got, c.want)
		}
	}
}

// shortRetries makes the pauses between dials short for a test; the
// returned func puts them back.
func shortRetries() func() {
	first, most := dialRetryFirst, dialRetryMax
	dialRetryFirst, dialRetryMax = 50*time.Millisecond, 200*time.Millisecond
	return func() { dialRetryFirst, dialRetryMax = first, most }
}

func port(ln net.Listener) string { return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port) }

// A slot a call made again takes just as its context ends is given back:
// select picks either case when both are ready, and each slot kept could
// leave FanOut waiting for one for good. Half of the tries here, with the
// slot free and the context over, pick the slot.
func TestRetakeGivesBackASlotAsTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sem := make(chan struct{}, 1)
	for i := range 200 {
		if retake(ctx, sem) {
			t.Fatalf("try %d: a slot taken after the context ended", i)
		}
		if len(sem) != 0 {
			t.Fatalf("try %d: the slot was kept", i)
		}
	}
	if !retake(context.Background(), sem) || len(sem) != 1 {
		t.Fatal("a slot free and a context that lasts: not taken")
	}
}

// A call whose stream did not open is made again only when nothing can
// have been sent and the failure may pass: a dial that timed out, or a
// connection closed before the stream opened (what libp2p's basic host
// reports as "connection failed", or as the connection's close while it
// negotiated the stream's protocol); never a refusal or a limit.
func TestOpenFailureMarksWhatMayBeTriedAgain(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	for _, c := range []struct {
		err   error
		again bool
		code  Code
	}{
		{fmt.Errorf("failed to dial: %w", context.DeadlineExceeded), true, CodeUnreachable},
		{errors.New("connection failed"), true, CodeUnreachable},
		{fmt.Errorf("failed to negotiate protocol: %w", &network.ConnError{}), true, CodeUnreachable},
		{fmt.Errorf("failed to negotiate protocol: %w", &quic.StatelessResetError{}), true, CodeUnreachable},
		{fmt.Errorf("failed to open stream: %w", &quic.IdleTimeoutError{}), true, CodeUnreachable},
		{fmt.Errorf("failed to negotiate protocol: %w", &net.OpError{Op: "write", Net: "tcp4", Err: os.NewSyscallError("write", syscall.ECONNRESET)}), true, CodeUnreachable},
		{fmt.Errorf("failed to negotiate protocol: %w", &net.OpError{Op: "write", Net: "tcp4", Err: os.NewSyscallError("write", syscall.EPIPE)}), true, CodeUnreachable},
		{fmt.Errorf("failed to negotiate protocol: %w", errors.New("protocols not supported")), false, CodeUnreachable},
		{refused, false, CodeUnreachable},
		{fmt.Errorf("%w: streams", network.ErrResourceLimitExceeded), false, CodeBusy},
	} {
		r := openFailure(context.Background(), "x", c.err)
		if r.again != c.again || r.Code != c.code {
			t.Errorf("%v: again %v, code %s; want %v, %s", c.err, r.again, r.Code, c.again, c.code)
		}
	}
}
