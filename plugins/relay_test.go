package plugins

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/tribeagent/tribe/internal/edsigner"
)

// relayNode is a real host on loopback serving calls (echo, and count,
// which counts its runs) and RelayProtocol.
type relayNode struct {
	host   host.Host
	server *Server
	relay  *Relay
	auth   *tableAuth
	runs   *atomic.Int64
	gate   chan struct{} // when set before the node is made, count waits for it
	caller *Caller
}

// counter is a plugin that counts its runs; with a gate, each run waits
// for the gate to open.
type counter struct {
	runs *atomic.Int64
	gate chan struct{}
}

func (counter) Name() string      { return "count" }
func (counter) Version() string   { return "1" }
func (counter) Kind() Kind        { return Action }
func (counter) Methods() []string { return []string{"run"} }
func (c counter) Call(context.Context, string, json.RawMessage) (json.RawMessage, error) {
	n := c.runs.Add(1)
	if c.gate != nil {
		<-c.gate
	}
	return json.Marshal(n)
}

// newRelayNode serves echo and count to the callers allowed, and relays
// the orders of those counts says count (nil: everyone's).
func newRelayNode(t *testing.T, counts func(peer.ID) bool, allowed ...peer.ID) *relayNode {
	t.Helper()
	return newGatedRelayNode(t, nil, counts, allowed...)
}

// newGatedRelayNode is newRelayNode whose count waits for gate (nil: it
// does not wait).
func newGatedRelayNode(t *testing.T, gate chan struct{}, counts func(peer.ID) bool, allowed ...peer.ID) *relayNode {
	t.Helper()
	n := &relayNode{host: newHost(t), runs: new(atomic.Int64), gate: gate}
	reg := Builtins(Env{})
	reg.Register("count", func(map[string]string) (Plugin, error) { return counter{n.runs, gate}, nil })
	echo, err := reg.Load("echo", "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	count, err := reg.Load("count", "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	n.auth = &tableAuth{allowed: map[peer.ID]bool{}, instances: map[string]*Instance{"echo": echo, "count": count}}
	for _, p := range allowed {
		n.auth.allowed[p] = true
	}
	n.server = NewServer(n.host, n.auth, slog.New(slog.DiscardHandler))
	n.server.Start()
	n.relay = NewRelay(RelayDeps{Host: n.host, Server: n.server, Key: n.host.Peerstore().PrivKey(n.host.ID()), Counts: counts})
	n.relay.Start()
	n.caller = NewCaller(n.host, 8)
	t.Cleanup(func() { n.relay.Close(); n.server.Close(); n.caller.Close() })
	return n
}

func (n *relayNode) allow(p peer.ID) {
	n.auth.mu.Lock()
	n.auth.allowed[p] = true
	n.auth.mu.Unlock()
}

func (n *relayNode) key() crypto.PrivKey { return n.host.Peerstore().PrivKey(n.host.ID()) }

// knows makes b dialable from a.
func knows(a, b *relayNode) {
	a.host.Peerstore().AddAddrs(b.host.ID(), b.host.Addrs(), peerstore.TempAddrTTL)
}

func connect(t *testing.T, a, b *relayNode) {
	t.Helper()
	if err := a.host.Connect(context.Background(), peer.AddrInfo{ID: b.host.ID(), Addrs: b.host.Addrs()}); err != nil {
		t.Fatal(err)
	}
}

func order(id, plugin, method string, ttl time.Duration, targets ...*relayNode) *Order {
	o := &Order{ID: id, Plugin: plugin, Method: method, Args: json.RawMessage(`{"ping":1}`), Deadline: time.Now().Add(ttl).UnixMilli()}
	for _, t := range targets {
		o.Targets = append(o.Targets, OrderTarget{Node: t.host.ID(), Tribe: "t"})
	}
	return o
}

func seal(t *testing.T, o *Order, key crypto.PrivKey) []byte {
	t.Helper()
	b, err := SealOrder(o, key)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// relayAll hands o to via and gathers every outcome by node.
func relayAll(c *relayNode, via *relayNode, o *Order, sealed []byte) map[peer.ID]RelayOutcome {
	got := map[peer.ID]RelayOutcome{}
	var mu sync.Mutex
	c.caller.Relay(context.Background(), via.host.ID(), o, sealed, true, func(oc RelayOutcome) {
		mu.Lock()
		defer mu.Unlock()
		if _, twice := got[oc.Node]; twice {
			panic("an outcome twice for " + oc.Node.String())
		}
		got[oc.Node] = oc
	})
	return got
}

// A caller connected to one relay reaches targets it holds no connection
// to, through it, the relay itself included; each answer is the target's,
// and the caller never connects to the targets.
func TestRelayReachesTargetsThroughARelay(t *testing.T) {
	c := newRelayNode(t, nil)
	r := newRelayNode(t, nil, c.host.ID())
	var targets []*relayNode
	for range 3 {
		n := newRelayNode(t, nil, c.host.ID())
		knows(r, n)
		targets = append(targets, n)
	}
	connect(t, c, r)
	o := order("o1", "echo", "echo", 10*time.Second, append(targets, r)...)
	got := relayAll(c, r, o, seal(t, o, c.key()))
	if len(got) != 4 {
		t.Fatalf("%d outcomes for 4 targets", len(got))
	}
	for _, n := range append(targets, r) {
		oc := got[n.host.ID()]
		if !oc.Response.OK || string(oc.Response.Result) != `{"ping":1}` || oc.Again || oc.Response.ID != "o1" {
			t.Fatalf("%s: %+v", n.host.ID(), oc)
		}
		if n != r && c.host.Network().Connectedness(n.host.ID()) == network.Connected {
			t.Fatalf("the caller connected to the target %s", n.host.ID())
		}
	}
}

// An order runs once on a target, however often it is handed over
// (replayed by a relay, or sent again directly after a relay lost its
// answer): each time after the first gets the answer of the first run.
func TestOrderRunsOnce(t *testing.T) {
	c := newRelayNode(t, nil)
	n := newRelayNode(t, nil, c.host.ID())
	connect(t, c, n)
	o := order("once", "count", "run", 10*time.Second, n)
	sealed := seal(t, o, c.key())
	first := c.caller.Order(context.Background(), n.host.ID(), o, sealed)
	if !first.OK || string(first.Result) != "1" {
		t.Fatalf("first: %+v", first)
	}
	again := c.caller.Order(context.Background(), n.host.ID(), o, sealed)
	if !again.OK || string(again.Result) != "1" {
		t.Fatalf("again: %+v", again)
	}
	// Through a relay as well.
	r := newRelayNode(t, nil)
	knows(r, n)
	connect(t, c, r)
	oc := relayAll(c, r, o, sealed)[n.host.ID()]
	if !oc.Response.OK || string(oc.Response.Result) != "1" {
		t.Fatalf("through a relay: %+v", oc)
	}
	if runs := n.runs.Load(); runs != 1 {
		t.Fatalf("the order ran %d times", runs)
	}
	if got := n.relay.AnsweredAgain(); got != 2 {
		t.Fatalf("answered again %d times, want 2", got)
	}
	if len(n.server.Refused()) != 0 {
		t.Fatalf("refusals counted: %v", n.server.Refused())
	}
}

// An order that comes again while its first run has not ended waits for
// that run's answer; it does not run twice.
func TestOrderAgainWaitsForTheFirstRun(t *testing.T) {
	gate := make(chan struct{})
	c := newRelayNode(t, nil)
	n := newGatedRelayNode(t, gate, nil, c.host.ID())
	connect(t, c, n)
	o := order("slow", "count", "run", 10*time.Second, n)
	sealed := seal(t, o, c.key())
	answers := make(chan Response, 2)
	for range 2 {
		go func() { answers <- c.caller.Order(context.Background(), n.host.ID(), o, sealed) }()
	}
	// Both in: the first running, the second waiting for it.
	for n.runs.Load() == 0 || n.server.InFlight(c.host.ID()) < 2 {
		time.Sleep(time.Millisecond)
	}
	close(gate)
	for range 2 {
		if a := <-answers; !a.OK || string(a.Result) != "1" {
			t.Fatalf("answer: %+v", a)
		}
	}
	if runs := n.runs.Load(); runs != 1 {
		t.Fatalf("the order ran %d times", runs)
	}
}

// An answer too large to keep is not sent again: the order, sent again,
// is refused as taken, and does not run again.
func TestLargeAnswerIsNotKept(t *testing.T) {
	c := newRelayNode(t, nil)
	n := newRelayNode(t, nil, c.host.ID())
	connect(t, c, n)
	o := order("big", "echo", "echo", 10*time.Second, n)
	o.Args = json.RawMessage(`"` + strings.Repeat("x", maxKeptAnswer) + `"`)
	sealed := seal(t, o, c.key())
	if first := c.caller.Order(context.Background(), n.host.ID(), o, sealed); !first.OK {
		t.Fatalf("first: %+v", first)
	}
	again := c.caller.Order(context.Background(), n.host.ID(), o, sealed)
	if again.OK || again.Code != CodeBadRequest || !strings.Contains(again.Error, "already took this order") {
		t.Fatalf("again: %+v", again)
	}
	if n.server.Refused()[CodeBadRequest] != 1 {
		t.Fatalf("refusals counted: %v", n.server.Refused())
	}
}

// Orders that do not carry the caller's authority are refused, counted,
// and run nothing: a caller the target does not allow, a target the order
// does not list, a deadline past, a tampered envelope; a relay passes on
// nothing for a caller that does not count there.
func TestOrdersWithoutAuthorityRunNothing(t *testing.T) {
	c := newRelayNode(t, nil)
	stranger := newRelayNode(t, nil)
	n := newRelayNode(t, nil, c.host.ID())
	other := newRelayNode(t, nil, c.host.ID())
	connect(t, c, n)
	connect(t, stranger, n)
	ctx := context.Background()

	o := order("s1", "count", "run", 10*time.Second, n)
	if r := stranger.caller.Order(ctx, n.host.ID(), o, seal(t, o, stranger.key())); r.Code != CodeUnauthorized {
		t.Fatalf("a caller not allowed: %+v", r)
	}
	o = order("s2", "count", "run", 10*time.Second, other)
	if r := c.caller.Order(ctx, n.host.ID(), o, seal(t, o, c.key())); r.Code != CodeUnauthorized || !strings.Contains(r.Error, "not a target") {
		t.Fatalf("an order for another node: %+v", r)
	}
	o = order("s3", "count", "run", -time.Second, n)
	if r := c.caller.Order(ctx, n.host.ID(), o, seal(t, o, c.key())); r.Code != CodeTimeout || !strings.Contains(r.Error, "deadline passed") {
		t.Fatalf("an order past its deadline: %+v", r)
	}
	o = order("s4", "count", "run", 10*time.Second, n)
	tampered := seal(t, o, c.key())
	i := strings.Index(string(tampered), `"count"`)
	tampered[i+1] = 'k' // "kount": the signature no longer holds
	if r := c.caller.Order(ctx, n.host.ID(), o, tampered); r.Code != CodeGone {
		t.Fatalf("a tampered order: %+v", r)
	}
	// A relay that counts only c passes on nothing for the stranger: the
	// stranger hears that it may try the targets itself.
	r := newRelayNode(t, func(p peer.ID) bool { return p == c.host.ID() })
	knows(r, n)
	connect(t, stranger, r)
	o = order("s5", "count", "run", 10*time.Second, n)
	oc := relayAll(stranger, r, o, seal(t, o, stranger.key()))[n.host.ID()]
	if !oc.Again || oc.Response.OK {
		t.Fatalf("relayed for a stranger: %+v", oc)
	}
	if runs := n.runs.Load(); runs != 0 {
		t.Fatalf("ran %d times", runs)
	}
	if got := n.server.Refused(); got[CodeUnauthorized] != 2 || got[CodeTimeout] != 1 || got[CodeBadRequest] != 1 {
		t.Fatalf("refusals counted: %v", got)
	}
	if got := r.server.Refused(); got[CodeUnauthorized] != 1 {
		t.Fatalf("the relay's refusals: %v", got)
	}
}

// A relay that cannot reach a target says so, and the caller may send the
// order to it directly; the order then runs there once.
func TestRelayNotesATargetItCannotReach(t *testing.T) {
	c := newRelayNode(t, nil)
	r := newRelayNode(t, nil, c.host.ID())
	far := newRelayNode(t, nil, c.host.ID()) // r knows no address of it
	connect(t, c, r)
	o := order("far", "count", "run", 10*time.Second, far)
	sealed := seal(t, o, c.key())
	oc := relayAll(c, r, o, sealed)[far.host.ID()]
	if !oc.Again || oc.Response.Code != CodeUnreachable || !strings.Contains(oc.Response.Error, "relayed by") {
		t.Fatalf("a target the relay cannot reach: %+v", oc)
	}
	knows(c, far)
	if resp := c.caller.Order(context.Background(), far.host.ID(), o, sealed); !resp.OK || string(resp.Result) != "1" {
		t.Fatalf("sent directly after: %+v", resp)
	}
}

// A relay that makes up answers (signed by itself, or for another order)
// is caught: the caller takes none of them, and hears the targets it has
// no answer for as to be tried again.
func TestForgedAnswersAreCaught(t *testing.T) {
	c := newRelayNode(t, nil)
	n := newRelayNode(t, nil, c.host.ID())
	for name, forge := range map[string]func(liar *relayNode, o *Order) []byte{
		"signed by the relay": func(liar *relayNode, o *Order) []byte {
			b, _ := sealAnswerFrame(&Answer{Order: o.ID, Caller: c.host.ID(), Response: Response{ID: o.ID, OK: true}}, liar.key())
			return b
		},
		"for another order": func(_ *relayNode, o *Order) []byte {
			b, _ := sealAnswerFrame(&Answer{Order: "other", Caller: c.host.ID(), Response: Response{ID: "other", OK: true}}, n.key())
			return b
		},
		"a note on a node not listed": func(liar *relayNode, o *Order) []byte {
			return noteFrame(Note{Node: liar.host.ID(), Code: CodeGone, Error: "x"})
		},
	} {
		liar := newRelayNode(t, nil)
		liar.host.SetStreamHandler(RelayProtocol, func(st network.Stream) {
			defer st.Close()
			writeFrame(st, forge(liar, order("x", "echo", "echo", time.Minute, n)))
		})
		connect(t, c, liar)
		o := order("x", "echo", "echo", 10*time.Second, n)
		oc := relayAll(c, liar, o, seal(t, o, c.key()))[n.host.ID()]
		if oc.Response.OK || !oc.Again || !strings.Contains(oc.Response.Error, "broke the protocol") {
			t.Fatalf("%s: %+v", name, oc)
		}
	}
}

// A relay that says its targets timed out (or answered garbage) when they
// did not is not believed: each such target is handed back, to be sent
// the order again, and answers it.
func TestLyingRelayCostsASecondTry(t *testing.T) {
	c := newRelayNode(t, nil)
	n := newRelayNode(t, nil, c.host.ID())
	for _, note := range []Note{
		{Delivered: true, Code: CodeTimeout, Error: "no answer before the deadline"},
		{Delivered: true, Code: CodeBadResponse, Error: "the node answered with something else"},
	} {
		note.Node = n.host.ID()
		liar := newRelayNode(t, nil)
		liar.host.SetStreamHandler(RelayProtocol, func(st network.Stream) {
			defer st.Close()
			writeFrame(st, noteFrame(note))
		})
		connect(t, c, liar)
		o := order("x-"+string(note.Code), "echo", "echo", 10*time.Second, n)
		sealed := seal(t, o, c.key())
		oc := relayAll(c, liar, o, sealed)[n.host.ID()]
		if !oc.Again || oc.Response.Code != note.Code {
			t.Fatalf("a relay's note %s: %+v, want it handed back", note.Code, oc)
		}
		connect(t, c, n)
		if got := c.caller.Order(context.Background(), n.host.ID(), o, sealed); !got.OK {
			t.Fatalf("sent again after the relay's %s: %+v", note.Code, got)
		}
	}
}

// An order's codec refuses what is not one.
func TestOrderCheck(t *testing.T) {
	c := newRelayNode(t, nil)
	n := newRelayNode(t, nil)
	good := func() *Order { return order("id", "echo", "echo", time.Minute, n) }
	for name, change := range map[string]func(*Order){
		"no id":           func(o *Order) { o.ID = "" },
		"no deadline":     func(o *Order) { o.Deadline = 0 },
		"no targets":      func(o *Order) { o.Targets = nil },
		"a target twice":  func(o *Order) { o.Targets = append(o.Targets, o.Targets[0]) },
		"bad plugin name": func(o *Order) { o.Plugin = "../x" },
		"too many targets": func(o *Order) {
			for range MaxOrderTargets {
				o.Targets = append(o.Targets, OrderTarget{Node: c.host.ID()})
			}
		},
	} {
		o := good()
		change(o)
		if _, err := SealOrder(o, c.key()); err == nil {
			t.Errorf("%s: sealed", name)
		}
	}
	o, caller, err := OpenOrder(seal(t, good(), c.key()))
	if err != nil || caller != c.host.ID() || o.Targets[0].Node != n.host.ID() {
		t.Fatalf("open: %v %s %+v", err, caller, o)
	}
	// Signed with a key no agent has: refused before its signature is
	// checked.
	ecdsa, _, _ := crypto.GenerateECDSAKeyPair(rand.Reader)
	if _, _, err := OpenOrder(seal(t, good(), ecdsa)); !errors.Is(err, ErrBadOrder) || !errors.Is(err, edsigner.ErrKeyType) {
		t.Fatalf("an order signed with an ECDSA key: %v", err)
	}
	// An answer is not an order, though both are signed envelopes.
	a, _ := SealAnswer(&Answer{Order: "id", Caller: c.host.ID(), Response: Response{ID: "id", OK: true}}, c.key())
	if _, _, err := OpenOrder(a); err == nil {
		t.Fatal("an answer opened as an order")
	}
}

// In ModeNear a relay calls only the targets it holds a connection to,
// dials none, and notes the others at once as to be tried again.
func TestRelayNearDialsNone(t *testing.T) {
	c := newRelayNode(t, nil)
	r := newRelayNode(t, nil, c.host.ID())
	near := newRelayNode(t, nil, c.host.ID())
	far := newRelayNode(t, nil, c.host.ID())
	knows(r, far) // dialable, but not to be dialled
	connect(t, c, r)
	connect(t, r, near)
	o := order("near", "echo", "echo", 10*time.Second, near, far)
	got := map[peer.ID]RelayOutcome{}
	c.caller.Relay(context.Background(), r.host.ID(), o, seal(t, o, c.key()), false, func(oc RelayOutcome) { got[oc.Node] = oc })
	if oc := got[near.host.ID()]; !oc.Response.OK {
		t.Fatalf("near: %+v", oc)
	}
	if oc := got[far.host.ID()]; !oc.Again || !strings.Contains(oc.Response.Error, "not connected") {
		t.Fatalf("far: %+v", oc)
	}
	if r.host.Network().Connectedness(far.host.ID()) == network.Connected {
		t.Fatal("the relay dialled")
	}
}

// A node relays an order only for its signer: another node that holds it
// (a relay it was handed to, a target) cannot make every node it reaches
// pass it on to all its targets once more, in the caller's relay slots.
// The refusal is counted; the signer's own hand-off of it goes through.
func TestRelayOnlyForTheOrdersSigner(t *testing.T) {
	c := newRelayNode(t, nil)
	x := newRelayNode(t, nil)
	r := newRelayNode(t, nil, c.host.ID())
	n := newRelayNode(t, nil, c.host.ID())
	knows(r, n)
	connect(t, c, r)
	connect(t, x, r)
	o := order("laundered", "count", "run", 10*time.Second, n)
	sealed := seal(t, o, c.key())
	for _, dial := range []bool{true, false} {
		var got []RelayOutcome
		x.caller.Relay(context.Background(), r.host.ID(), o, sealed, dial, func(oc RelayOutcome) { got = append(got, oc) })
		if len(got) != 1 || got[0].Response.OK || !got[0].Again {
			t.Fatalf("relayed for another than its signer (dial %v): %+v", dial, got)
		}
	}
	if runs := n.runs.Load(); runs != 0 {
		t.Fatalf("the order ran %d times", runs)
	}
	if got := r.server.Refused(); got[CodeUnauthorized] != 2 {
		t.Fatalf("the relay's refusals: %v", got)
	}
	if oc := relayAll(c, r, o, sealed)[n.host.ID()]; !oc.Response.OK || string(oc.Response.Result) != "1" {
		t.Fatalf("the signer's own hand-off: %+v", oc)
	}
}

// A peer that does not count gets as few relay streams as call streams
// (they share StrangerCallStreams), refused (reset, counted) as they
// open, before any byte of an order is read: each used to wait
// readTimeout for a frame of up to maxOrderSize, as many as libp2p let
// through.
func TestStrangersGetFewRelayStreams(t *testing.T) {
	oldRead := readTimeout
	readTimeout = time.Minute // held streams wait for the test's end
	defer func() { readTimeout = oldRead }()
	member, stranger := newRelayNode(t, nil), newRelayNode(t, nil)
	n := newRelayNode(t, nil, member.host.ID())
	n.server.counts = func(p peer.ID) bool { return p == member.host.ID() }
	connect(t, stranger, n)
	connect(t, member, n)
	var reset atomic.Int64
	openHeld(t, stranger.host, n.host.ID(), RelayProtocol, StrangerCallStreams+6, &reset)
	waitUntil(t, "the stranger's relay streams past its share reset", func() bool { return reset.Load() == 6 })
	if got := n.server.Refused()[CodeUnauthorized]; got != 6 {
		t.Errorf("counted %d stranger streams refused, want 6", got)
	}
	o := order("m", "count", "run", 10*time.Second, n)
	if r := member.caller.Order(context.Background(), n.host.ID(), o, seal(t, o, member.key())); !r.OK {
		t.Errorf("a member's order while the stranger holds its streams: %+v", r)
	}
}

// A node remembers each order until its deadline, at most
// maxRememberedPerCaller of one caller's at once: one caller cannot fill
// the memory the others' orders need; once the deadlines pass, there is
// room again. A caller that does not count takes none.
func TestOrdersRememberedAreBoundedPerCaller(t *testing.T) {
	r := NewRelay(RelayDeps{})
	a, b := peer.ID("a"), peer.ID("b")
	now := time.Now()
	soon := now.Add(time.Minute).UnixMilli()
	for i := range maxRememberedPerCaller {
		if _, err := r.take(a, fmt.Sprint("a/", i), soon, now, true); err != nil {
			t.Fatalf("order %d: %v", i, err)
		}
	}
	if _, err := r.take(a, "a/more", soon, now, true); err == nil || err.Code != CodeBusy {
		t.Fatalf("past the bound: %v", err)
	}
	if _, err := r.take(b, "b/1", soon, now, true); err != nil {
		t.Fatalf("another caller: %v", err)
	}
	if before, err := r.take(b, "b/1", soon, now, true); err != nil || before == nil {
		t.Fatalf("the same order again: %v, %v", before, err)
	}
	if _, err := r.take(a, "a/more", soon, now.Add(2*time.Minute), true); err != nil {
		t.Fatalf("after the deadlines passed: %v", err)
	}

	c := newRelayNode(t, nil)
	stranger := newRelayNode(t, nil)
	n := newRelayNode(t, func(p peer.ID) bool { return p == c.host.ID() }, c.host.ID(), stranger.host.ID())
	connect(t, stranger, n)
	o := order("s", "count", "run", 10*time.Second, n)
	if resp := stranger.caller.Order(context.Background(), n.host.ID(), o, seal(t, o, stranger.key())); resp.Code != CodeUnauthorized || !strings.Contains(resp.Error, "does not count") {
		t.Fatalf("a stranger's order: %+v", resp)
	}
	if len(n.relay.ran) != 0 || n.runs.Load() != 0 {
		t.Fatalf("a stranger's order was remembered (%d) or ran (%d)", len(n.relay.ran), n.runs.Load())
	}
}

// loseFirstAnswer makes n lose the answer of the first order it takes:
// its stream breaks as n writes it.
func loseFirstAnswer(n *relayNode) {
	var streams atomic.Int64
	n.host.SetStreamHandler(RelayProtocol, func(st network.Stream) {
		if streams.Add(1) == 1 {
			n.relay.handle(lossyStream{st})
			return
		}
		n.relay.handle(st)
	})
}

// lossyStream loses what is written to it: the stream breaks instead.
type lossyStream struct{ network.Stream }

func (s lossyStream) Write([]byte) (int, error) {
	s.Stream.Reset()
	return 0, network.ErrReset
}

// An order sent directly whose answer is lost on the way (the target ran
// it, then the stream broke) is sent again within the call's deadline,
// and the target answers it with the answer it kept: it runs once.
func TestOrderWhoseAnswerWasLostIsSentAgain(t *testing.T) {
	c := newRelayNode(t, nil)
	n := newRelayNode(t, nil, c.host.ID())
	connect(t, c, n)
	loseFirstAnswer(n)
	o := order("lost", "count", "run", 10*time.Second, n)
	sealed := seal(t, o, c.key())
	var got Response
	again := FanOut(context.Background(), []peer.ID{n.host.ID()}, 1, func(ctx context.Context, p peer.ID) Response {
		return c.caller.Order(ctx, p, o, sealed)
	}, func(_ peer.ID, r Response) { got = r })
	if !got.OK || string(got.Result) != "1" || again != 1 {
		t.Fatalf("answer %+v after %d more sends", got, again)
	}
	if runs, answered := n.runs.Load(), n.relay.AnsweredAgain(); runs != 1 || answered != 1 {
		t.Fatalf("ran %d times, answered again %d times", runs, answered)
	}
}

// An order this node could not write (its stream or connection broke as
// it was sent) is sent again within the call's deadline: the target runs
// it once.
func TestOrderNotSentIsSentAgain(t *testing.T) {
	c := newRelayNode(t, nil)
	n := newRelayNode(t, nil, c.host.ID())
	connect(t, c, n)
	caller := NewCaller(&breakFirstWrite{Host: c.host}, 0)
	t.Cleanup(func() { caller.Close() })
	o := order("unsent", "count", "run", 10*time.Second, n)
	sealed := seal(t, o, c.key())
	var got Response
	again := FanOut(context.Background(), []peer.ID{n.host.ID()}, 1, func(ctx context.Context, p peer.ID) Response {
		return caller.Order(ctx, p, o, sealed)
	}, func(_ peer.ID, r Response) { got = r })
	if !got.OK || string(got.Result) != "1" || again != 1 {
		t.Fatalf("answer %+v after %d more sends", got, again)
	}
	if runs := n.runs.Load(); runs != 1 {
		t.Fatalf("the order ran %d times", runs)
	}
}

// breakFirstWrite is a host whose first stream breaks when written to.
type breakFirstWrite struct {
	host.Host
	opened atomic.Int64
}

func (h *breakFirstWrite) NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error) {
	st, err := h.Host.NewStream(ctx, p, pids...)
	if err == nil && h.opened.Add(1) == 1 {
		return lossyStream{st}, nil
	}
	return st, err
}

// A target whose answer the relay lost (the target's stream broke after
// it took the order) is reported to be sent the order again; sent it, the
// target answers with the answer it kept.
func TestRelayLostAnswerIsSentAgain(t *testing.T) {
	c := newRelayNode(t, nil)
	r := newRelayNode(t, nil)
	n := newRelayNode(t, nil, c.host.ID())
	knows(r, n)
	connect(t, c, r)
	loseFirstAnswer(n)
	o := order("lost", "count", "run", 10*time.Second, n)
	sealed := seal(t, o, c.key())
	oc := relayAll(c, r, o, sealed)[n.host.ID()]
	if !oc.Again || oc.Response.Code != CodeGone {
		t.Fatalf("through the relay: %+v", oc)
	}
	connect(t, c, n)
	if got := c.caller.Order(context.Background(), n.host.ID(), o, sealed); !got.OK || string(got.Result) != "1" {
		t.Fatalf("sent again: %+v", got)
	}
	if runs := n.runs.Load(); runs != 1 {
		t.Fatalf("the order ran %d times", runs)
	}
}

// The budget for kept answers comes back as orders pass their deadlines:
// a node whose budget was spent keeps the next answer once the orders
// that spent it are past.
func TestKeptAnswersBudgetIsFreedByDeadlines(t *testing.T) {
	r := NewRelay(RelayDeps{})
	now := time.Now()
	soon := now.Add(time.Minute).UnixMilli()
	answer := make([]byte, maxKeptAnswer)
	for i := range maxKeptAnswers / maxKeptAnswer {
		key := fmt.Sprint("c/", i)
		if _, err := r.take(peer.ID(fmt.Sprint("c", i%8)), key, soon, now, true); err != nil {
			t.Fatal(err)
		}
		r.answered(key, answer, now)
	}
	if _, err := r.take("d", "d/1", now.Add(5*time.Minute).UnixMilli(), now, true); err != nil {
		t.Fatal(err)
	}
	r.answered("d/1", answer, now)
	if r.ran["d/1"].answer != nil {
		t.Fatal("an answer kept past the budget")
	}
	if _, err := r.take("d", "d/2", now.Add(5*time.Minute).UnixMilli(), now, true); err != nil {
		t.Fatal(err)
	}
	r.answered("d/2", answer, now.Add(2*time.Minute)) // the first orders are past
	if r.ran["d/2"].answer == nil || r.kept != maxKeptAnswer {
		t.Fatalf("after the deadlines: answer kept %v, %d bytes kept", r.ran["d/2"].answer != nil, r.kept)
	}
	// Nothing past its deadline: nothing goes. Then the last two go.
	r.forget(now.Add(3 * time.Minute))
	if len(r.ran) != 2 {
		t.Fatalf("%d orders remembered before their deadlines, want 2", len(r.ran))
	}
	r.forget(now.Add(6 * time.Minute))
	if len(r.ran) != 0 || r.kept != 0 {
		t.Fatalf("past every deadline: %d orders, %d bytes kept", len(r.ran), r.kept)
	}
}
