package plugins

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
)

// gate is a plugin whose calls wait until the gate opens.
type gate struct{ open chan struct{} }

func (*gate) Name() string      { return "gate" }
func (*gate) Version() string   { return "1" }
func (*gate) Kind() Kind        { return Processor }
func (*gate) Methods() []string { return []string{"wait"} }
func (g *gate) Call(ctx context.Context, _ string, _ json.RawMessage) (json.RawMessage, error) {
	select {
	case <-g.open:
		return json.RawMessage(`"through"`), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// callHost is a loopback host whose resource manager lets the call
// protocol's streams through as AddLimits says, on libp2p's defaults for
// a host with 1 GiB to spend (fixed, so the test does not depend on the
// machine's memory).
func callHost(t *testing.T) host.Host {
	t.Helper()
	cfg := rcmgr.DefaultLimits
	AddLimits(&cfg)
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(cfg.Scale(1<<30, 1024)))
	if err != nil {
		t.Fatal(err)
	}
	return newHost(t, libp2p.ResourceManager(rm))
}

func TestFloodFromOneCallerIsRefusedAsBusyAndCounted(t *testing.T) {
	caller, callee, other := callHost(t), callHost(t), callHost(t)
	g := &gate{open: make(chan struct{})}
	reg := Builtins(Env{})
	reg.Register("gate", func(map[string]string) (Plugin, error) { return g, nil })
	gateIn, err := reg.Load("gate", "t", nil) // default concurrency and queue
	if err != nil {
		t.Fatal(err)
	}
	echoIn, err := reg.Load("echo", "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	auth := &tableAuth{allowed: map[peer.ID]bool{caller.ID(): true, other.ID(): true},
		instances: map[string]*Instance{"gate": gateIn, "echo": echoIn}}
	srv := NewServer(callee, auth, slog.New(slog.DiscardHandler))
	srv.Start()
	t.Cleanup(func() { srv.Close() })
	for _, h := range []host.Host{caller, other} {
		if err := h.Connect(context.Background(), peer.AddrInfo{ID: callee.ID(), Addrs: callee.Addrs()}); err != nil {
			t.Fatal(err)
		}
	}

	// One caller fires far more calls at once than the callee runs or
	// queues for one caller.
	const flood = 200
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	results := make(chan Response, flood)
	for range flood {
		go func() {
			results <- Call(ctx, caller, callee.ID(), Request{Plugin: "gate", Method: "wait", Deadline: time.Minute.Milliseconds()})
		}()
	}
	// The calls over the cap come back at once; the others wait at the
	// gate.
	got := map[Code]int{}
	early := 0
	wait := time.After(15 * time.Second)
collect:
	for early < flood-MaxCallsPerCaller {
		select {
		case r := <-results:
			got[r.Code]++
			early++
		case <-wait:
			break collect
		}
	}

	// Another peer's calls still go through, to the flooded plugin too:
	// one caller's cap leaves room in its queue.
	var wg sync.WaitGroup
	others := make(chan Response, 5)
	for range 4 {
		wg.Go(func() {
			others <- Call(ctx, other, callee.ID(), Request{Plugin: "gate", Method: "wait", Deadline: time.Minute.Milliseconds()})
		})
	}
	if r := Call(ctx, other, callee.ID(), Request{Plugin: "echo", Method: "echo", Args: json.RawMessage(`1`)}); !r.OK {
		t.Errorf("another peer's echo during the flood: %+v", r)
	}

	close(g.open)
	for range flood - early {
		r := <-results
		got[r.Code]++
	}
	wg.Wait()
	close(others)
	for r := range others {
		if !r.OK {
			t.Errorf("another peer's call to the flooded plugin: %+v", r)
		}
	}

	t.Logf("flood of %d: %v (\"\" is answered)", flood, got)
	busy := got[CodeBusy]
	if answered := got[""]; answered+busy != flood {
		t.Errorf("every call must be answered or refused as busy; got %v", got)
	}
	if answered := got[""]; answered != MaxCallsPerCaller {
		t.Errorf("%d calls answered, want the %d the callee takes from one caller", answered, MaxCallsPerCaller)
	}
	if counted := srv.Refused()[CodeBusy]; counted != int64(busy) {
		t.Errorf("the callee counted %d busy refusals, the caller got %d", counted, busy)
	}
}

// A call that meets a resource limit on the caller's side says so, as
// busy, naming the scope, instead of a bare "cannot reach".
func TestCallAtTheOutboundLimitSaysSo(t *testing.T) {
	callee := callHost(t)
	cfg := rcmgr.PartialLimitConfig{System: rcmgr.ResourceLimits{ConnsOutbound: rcmgr.BlockAllLimit}}
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(cfg.Build(rcmgr.DefaultLimits.Scale(1<<30, 1024))))
	if err != nil {
		t.Fatal(err)
	}
	caller := newHost(t, libp2p.ResourceManager(rm))
	caller.Peerstore().AddAddrs(callee.ID(), callee.Addrs(), time.Minute)
	r := Call(context.Background(), caller, callee.ID(), Request{ID: "1", Plugin: "echo", Method: "echo"})
	if r.Code != CodeBusy || !strings.Contains(r.Error, "limit") || !strings.Contains(r.Error, "system") {
		t.Errorf("a call past the outbound connection limit: %+v", r)
	}
}

// Callers that do not count get a few call streams each and a few in
// all, refused (reset, counted) as they open, not after the request
// deadline: eight strangers with 256 streams each used to hold every
// inbound stream a node allows, its members' probes and calls included.
func TestStrangersGetFewCallStreams(t *testing.T) {
	oldRead, oldAll := readTimeout, strangerStreamsAll
	readTimeout, strangerStreamsAll = time.Minute, StrangerCallStreams+2 // held streams wait for the test's end
	defer func() { readTimeout, strangerStreamsAll = oldRead, oldAll }()
	callee, member, s1, s2 := callHost(t), callHost(t), callHost(t), callHost(t)
	reg := Builtins(Env{})
	echoIn, err := reg.Load("echo", "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	auth := &tableAuth{allowed: map[peer.ID]bool{member.ID(): true}, instances: map[string]*Instance{"echo": echoIn}}
	srv := NewServer(callee, auth, slog.New(slog.DiscardHandler),
		WithCounts(func(p peer.ID) bool { return p == member.ID() }))
	srv.Start()
	t.Cleanup(func() { srv.Close() })
	for _, h := range []host.Host{member, s1, s2} {
		if err := h.Connect(context.Background(), peer.AddrInfo{ID: callee.ID(), Addrs: callee.Addrs()}); err != nil {
			t.Fatal(err)
		}
	}
	var reset1, reset2 atomic.Int64
	openHeld(t, s1, callee.ID(), ProtocolID, 10, &reset1)
	waitUntil(t, "the first stranger's streams past its share reset", func() bool { return reset1.Load() == 10-StrangerCallStreams })
	openHeld(t, s2, callee.ID(), ProtocolID, 4, &reset2) // all strangers' share has 2 left
	waitUntil(t, "the second stranger's streams past all strangers' share reset", func() bool { return reset2.Load() == 2 })
	if r := Call(context.Background(), member, callee.ID(), Request{Plugin: "echo", Method: "echo", Args: json.RawMessage(`1`)}); !r.OK {
		t.Errorf("a member's call while strangers hold their streams: %+v", r)
	}
	if got := srv.Refused()[CodeUnauthorized]; got != 8 {
		t.Errorf("counted %d stranger streams refused, want 8", got)
	}
	if reset1.Load() != 10-StrangerCallStreams || reset2.Load() != 2 {
		t.Errorf("streams reset: %d and %d, want %d and 2", reset1.Load(), reset2.Load(), 10-StrangerCallStreams)
	}
}

// openHeld opens n streams of proto from h to to, each sending the first
// byte of a request and no more, and counts those the other end resets.
func openHeld(t *testing.T, h host.Host, to peer.ID, proto protocol.ID, n int, reset *atomic.Int64) {
	t.Helper()
	for range n {
		st, err := h.NewStream(context.Background(), to, proto)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Reset() })
		if _, err := st.Write([]byte{100}); err != nil {
			t.Fatal(err)
		}
		go func() {
			if _, err := st.Read(make([]byte, 1)); errors.Is(err, network.ErrReset) {
				reset.Add(1)
			}
		}()
	}
}
