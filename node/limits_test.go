package node

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	goyamux "github.com/libp2p/go-yamux/v5"
	"github.com/tribeagent/tribe/plugins"
)

// idleSockets are raw TCP connections that never say a word, as an
// attacker without the swarm key (or any key) can open.
type idleSockets struct {
	open   atomic.Int64 // connected now
	closed atomic.Int64 // closed by the agent (or refused), all told
}

// holdIdleSockets keeps n silent TCP connections from the loopback address
// src to dst open until the test ends: one the agent closes is opened again
// after a short pause, at most 20 times per socket.
func holdIdleSockets(t *testing.T, src string, dst net.Addr, n int) *idleSockets {
	t.Helper()
	s := &idleSockets{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	for range n {
		wg.Go(func() {
			for range 20 {
				c, err := d.DialContext(ctx, "tcp", dst.String())
				if err == nil {
					s.open.Add(1)
					stop := context.AfterFunc(ctx, func() { c.Close() })
					io.Copy(io.Discard, c) // the agent's greeting, then nothing until it (or the test's end) closes it
					stop()
					c.Close()
					s.open.Add(-1)
				}
				if ctx.Err() != nil {
					return
				}
				s.closed.Add(1)
				select {
				case <-ctx.Done():
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
		})
	}
	return s
}

// unauthenticated is how many inbound connections n's host holds that
// have not finished their handshake (the resource manager's transient
// scope).
func unauthenticated(n *Node) int {
	var st network.ScopeStat
	n.Host().Network().ResourceManager().ViewTransient(func(s network.ResourceScope) error {
		st = s.Stat()
		return nil
	})
	return st.NumConnsInbound
}

// tcpListenAddr is n's TCP listen address as a net.Addr.
func tcpListenAddr(t *testing.T, n *Node) (net.Addr, peer.AddrInfo) {
	t.Helper()
	for _, a := range n.Host().Addrs() {
		if _, err := a.ValueForProtocol(ma.P_TCP); err != nil {
			continue
		}
		na, err := manet.ToNetAddr(a)
		if err != nil {
			t.Fatal(err)
		}
		return na, peer.AddrInfo{ID: n.ID(), Addrs: []ma.Multiaddr{a}}
	}
	t.Fatal("no TCP listen address")
	return nil, peer.AddrInfo{}
}

// lightHost is a bare libp2p host that only dials TCP: a peer identity at
// the cost of a key and a few goroutines.
func lightHost(t *testing.T) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.NoListenAddrs, libp2p.Transport(tcp.NewTCPTransport),
		libp2p.DisableRelay(), libp2p.DisableMetrics(), libp2p.ResourceManager(&network.NullResourceManager{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// connectWithin connects h to ai, trying again (dial backoff cleared)
// until it works or d has passed.
func connectWithin(h host.Host, ai peer.AddrInfo, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		err := h.Connect(ctx, ai)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		if sw, ok := h.Network().(*swarm.Swarm); ok {
			sw.Backoff().Clear(ai.ID)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func quietLoopbackConfig(t *testing.T, name string) Config {
	c := loopbackConfig(t, name)
	c.DHT = false
	return c
}

func TestIdleSocketsDoNotBlockNewConnections(t *testing.T) {
	a := startNode(t, quietLoopbackConfig(t, "a"))
	addr, ai := tcpListenAddr(t, a)
	// A few dozen silent sockets from another address: twice libp2p's
	// default budget of unauthenticated connections (32), and as many as
	// one address may hold in the handshake here.
	const idle = handshakesPerIP
	s := holdIdleSockets(t, "127.0.0.2", addr, idle)
	waitFor(t, "the agent to take or refuse every idle socket", func() bool {
		return unauthenticated(a)+int(s.closed.Load()) >= idle
	})
	start := time.Now()
	if err := connectWithin(lightHost(t), ai, 10*time.Second); err != nil {
		t.Fatalf("a new peer could not connect past %d idle sockets (agent holds %d in the handshake, closed %d): %v",
			idle, unauthenticated(a), s.closed.Load(), err)
	}
	t.Logf("connected in %v past %d idle sockets (%d held in the handshake, %d closed by the agent)",
		time.Since(start).Round(time.Millisecond), idle, unauthenticated(a), s.closed.Load())
}

func TestIdleSocketsFromOneAddressAreCapped(t *testing.T) {
	a := startNode(t, quietLoopbackConfig(t, "a"))
	addr, ai := tcpListenAddr(t, a)
	// Far more silent sockets from one address than it may keep in the
	// handshake: the agent holds its cap and closes the rest at once.
	const idle = 160
	s := holdIdleSockets(t, "127.0.0.3", addr, idle)
	waitFor(t, "the agent to take or refuse every idle socket", func() bool {
		return unauthenticated(a)+int(s.closed.Load()) >= idle
	})
	if err := connectWithin(lightHost(t), ai, 10*time.Second); err != nil {
		t.Fatalf("a new peer could not connect past %d idle sockets from one address: %v", idle, err)
	}
	if got := unauthenticated(a); got > handshakesPerIP || s.closed.Load() == 0 {
		t.Fatalf("the agent holds %d unauthenticated connections from one address (cap %d) and closed %d",
			got, handshakesPerIP, s.closed.Load())
	}
}

func TestSilentSocketIsClosedAtTheHandshakeDeadline(t *testing.T) {
	a := startNode(t, quietLoopbackConfig(t, "a"))
	addr, _ := tcpListenAddr(t, a)
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	c.SetReadDeadline(start.Add(handshakeTimeout + 10*time.Second))
	io.Copy(io.Discard, c) // the agent's greeting, then silence until it hangs up
	if took := time.Since(start); took < handshakeTimeout-time.Second || took > handshakeTimeout+5*time.Second {
		t.Fatalf("the agent closed a silent socket after %v, want about %v", took.Round(time.Millisecond), handshakeTimeout)
	}
}

func TestManyIdentitiesDoNotLockOutAnAgent(t *testing.T) {
	a := startNode(t, quietLoopbackConfig(t, "a"))
	_, ai := tcpListenAddr(t, a)
	// 80 identities connect and stay: more than libp2p's default inbound
	// budget (64), fewer than the connection manager's high water mark.
	const identities = 80
	hosts := make([]host.Host, identities)
	for i := range hosts {
		hosts[i] = lightHost(t)
	}
	var (
		wg     sync.WaitGroup
		sem    = make(chan struct{}, 8)
		failed atomic.Int64
		errMu  sync.Mutex
		errs   []error
	)
	for _, h := range hosts {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := connectWithin(h, ai, 5*time.Second); err != nil {
				failed.Add(1)
				errMu.Lock()
				errs = append(errs, err)
				errMu.Unlock()
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d identities could not connect: %v", n, identities, errors.Join(errs[:min(3, len(errs))]...))
	}
	cb := quietLoopbackConfig(t, "b")
	cb.Join = []string{tcpAddr(a)}
	b := startNode(t, cb)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, heardB := a.peers.get(b.ID())
		_, heardA := b.peers.get(a.ID())
		if heardA && heardB {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a new agent did not join past %d connected identities (a has %d connections)",
				identities, len(a.Host().Network().Conns()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, h := range hosts {
		if h.Network().Connectedness(a.ID()) != network.Connected {
			t.Fatalf("an identity lost its connection: the agent trimmed below its high water mark")
		}
	}
}

// TestLimitsTable checks the resource manager's limits for the default
// config against the table in limitsFor's comment, and the rules that
// make the limits coherent.
func TestLimitsTable(t *testing.T) {
	l := limitsFor(DefaultConfig())
	lim := rcmgr.NewFixedLimiter(l.resourceLimits())
	sys, tr, peerL := lim.GetSystemLimits(), lim.GetTransientLimits(), lim.GetPeerLimits("any")
	call := lim.GetProtocolPeerLimits(plugins.ProtocolID)
	allCalls := lim.GetProtocolLimits(plugins.ProtocolID)
	in, out := network.DirInbound, network.DirOutbound
	for _, c := range []struct {
		what      string
		got, want int64
	}{
		{"handshake deadline (s)", int64(l.HandshakeTimeout / time.Second), 15},
		{"dial deadline (s)", int64(l.DialTimeout / time.Second), 15},
		{"in the handshake", int64(tr.GetConnLimit(in)), 512},
		{"in the handshake per address", int64(l.HandshakesPerIP), 64},
		{"inbound, handshakes included", int64(sys.GetConnLimit(in)), 1024 + 512},
		{"outbound", int64(sys.GetConnLimit(out)), 1024},
		{"per address", int64(l.PerIP), 256},
		{"peer streams inbound", int64(peerL.GetStreamLimit(in)), 384},
		{"peer streams", int64(peerL.GetStreamTotalLimit()), 512},
		{"call streams per peer inbound", int64(call.GetStreamLimit(in)), 256},
		{"call streams per peer outbound", int64(call.GetStreamLimit(out)), 256},
		{"streams inbound", int64(sys.GetStreamLimit(in)), 2048},
		{"streams", int64(sys.GetStreamTotalLimit()), 4096},
		{"call streams inbound", int64(allCalls.GetStreamLimit(in)), 1536},
		{"call streams outbound", int64(allCalls.GetStreamLimit(out)), 1536},
		{"file descriptors", int64(sys.GetFDLimit()), 2560},
		{"memory per peer (MiB)", peerL.GetMemoryLimit() >> 20, 128},
		{"memory (MiB)", sys.GetMemoryLimit() >> 20, 1024},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, the table says %d", c.what, c.got, c.want)
		}
	}

	c := DefaultConfig()
	c.ConnsPerIP = 2000
	if got := limitsFor(c).PerIP; got != 2000 {
		t.Errorf("per address with ConnsPerIP 2000: %d", got)
	}
	c.ConnsPerIP = -1
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "connections per IP") {
		t.Errorf("a negative ConnsPerIP: %v", err)
	}

	for _, high := range []int{16, 128, 1000} {
		c := DefaultConfig()
		c.ConnLow, c.ConnHigh = high/2, high
		l := limitsFor(c)
		lim := rcmgr.NewFixedLimiter(l.resourceLimits())
		sys, tr, peerL := lim.GetSystemLimits(), lim.GetTransientLimits(), lim.GetPeerLimits("any")
		call := lim.GetProtocolPeerLimits(plugins.ProtocolID)
		allCalls := lim.GetProtocolLimits(plugins.ProtocolID)
		for _, rule := range []struct {
			what string
			ok   bool
		}{
			// The connection manager decides who stays: the limits are
			// well above what it keeps.
			{"established inbound is at least 4 x ConnHigh", sys.GetConnLimit(in)-tr.GetConnLimit(in) >= 4*high},
			{"outbound is at least 4 x ConnHigh", sys.GetConnLimit(out) >= 4*high},
			{"one address may hold more than the connection manager keeps", l.PerIP > high},
			// Silent sockets never take an established connection's place,
			// and one source takes a small share of the handshakes.
			{"handshakes are a budget of their own", tr.GetConnLimit(in) == l.Handshakes && sys.GetConnLimit(in) == l.Inbound+l.Handshakes},
			{"one source takes at most an eighth of the handshakes", 8*l.HandshakesPerIP <= l.Handshakes},
			{"every connection has a file descriptor", sys.GetFDLimit() >= sys.GetConnTotalLimit() && tr.GetFDLimit() >= tr.GetConnTotalLimit()},
			// A caller's flood is refused by the call protocol, counted,
			// before libp2p resets a stream.
			{"call streams per peer hold the flood the server refuses", call.GetStreamLimit(in) >= plugins.CallStreamsPerPeer && plugins.CallStreamsPerPeer >= 2*plugins.MaxCallsPerCaller},
			{"a peer's streams hold its call streams and more", peerL.GetStreamLimit(in) > call.GetStreamLimit(in) && peerL.GetStreamLimit(out) > call.GetStreamLimit(out)},
			// Calls never take every stream: a member's probe still
			// gets through a flood of call streams.
			{"the call protocol leaves streams to the others", allCalls.GetStreamLimit(in) < sys.GetStreamLimit(in) && allCalls.GetStreamLimit(out) < sys.GetStreamLimit(out)},
			{"streams are negotiated within the transient budget", tr.GetStreamLimit(in) >= 4*peerL.GetStreamLimit(in)},
			// yamux closes a connection whose stream it cannot reserve
			// memory for: the stream counts must bind first.
			{"a peer's memory holds its streams' windows", peerL.GetMemoryLimit() >= int64(peerL.GetStreamTotalLimit())*yamuxStreamWindow},
			{"the system's memory holds every stream's window", sys.GetMemoryLimit() >= int64(sys.GetStreamTotalLimit())*yamuxStreamWindow},
		} {
			if !rule.ok {
				t.Errorf("ConnHigh %d: %s", high, rule.what)
			}
		}
	}
}

// gatePlugin's calls wait until its gate opens.
type gatePlugin struct{ open chan struct{} }

func (*gatePlugin) Name() string       { return "gate" }
func (*gatePlugin) Version() string    { return "1" }
func (*gatePlugin) Kind() plugins.Kind { return plugins.Processor }
func (*gatePlugin) Methods() []string  { return []string{"wait"} }
func (g *gatePlugin) Call(ctx context.Context, _ string, _ json.RawMessage) (json.RawMessage, error) {
	select {
	case <-g.open:
		return json.RawMessage(`"through"`), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// anyCaller lets every caller reach one instance.
type anyCaller struct{ in *plugins.Instance }

func (a anyCaller) Authorize(peer.ID, plugins.Request) (*plugins.Instance, error) { return a.in, nil }

// listeningAgentHost is buildHost's host listening on loopback TCP.
func listeningAgentHost(t *testing.T) host.Host {
	t.Helper()
	c := quietLoopbackConfig(t, "h")
	key, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := buildHost(c, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if err := h.Network().Listen(ma.StringCast("/ip4/127.0.0.1/tcp/0")); err != nil {
		t.Fatal(err)
	}
	return h
}

// The agent's own limits carry a flood of calls from one peer to the call
// protocol's busy refusal: none is reset on the way.
func TestAgentHostsCarryACallFloodToItsRefusal(t *testing.T) {
	caller, callee := listeningAgentHost(t), listeningAgentHost(t)
	g := &gatePlugin{open: make(chan struct{})}
	reg := plugins.NewRegistry()
	reg.Register("gate", func(map[string]string) (plugins.Plugin, error) { return g, nil })
	in, err := reg.Load("gate", "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := plugins.NewServer(callee, anyCaller{in}, slog.New(slog.DiscardHandler))
	srv.Start()
	t.Cleanup(func() { srv.Close() })
	if err := caller.Connect(context.Background(), peer.AddrInfo{ID: callee.ID(), Addrs: callee.Addrs()}); err != nil {
		t.Fatal(err)
	}
	const flood = 200
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	results := make(chan plugins.Response, flood)
	for range flood {
		go func() {
			results <- plugins.Call(ctx, caller, callee.ID(), plugins.Request{Plugin: "gate", Method: "wait", Deadline: time.Minute.Milliseconds()})
		}()
	}
	got := map[plugins.Code]int{}
	early, wait := 0, time.After(15*time.Second)
collect:
	for early < flood-plugins.MaxCallsPerCaller {
		select {
		case r := <-results:
			got[r.Code]++
			early++
		case <-wait:
			break collect
		}
	}
	close(g.open)
	for range flood - early {
		got[(<-results).Code]++
	}
	t.Logf("flood of %d: %v (\"\" is answered)", flood, got)
	if got[""]+got[plugins.CodeBusy] != flood {
		t.Errorf("every call must be answered or refused as busy; got %v", got)
	}
	if counted := srv.Refused()[plugins.CodeBusy]; counted != int64(got[plugins.CodeBusy]) {
		t.Errorf("the callee counted %d busy refusals, the caller got %d", counted, got[plugins.CodeBusy])
	}
}

// The muxer is libp2p's yamux but for how often it measures round trips
// again and its keepalives (off: the kernel's TCP keepalive and closeDead
// find a peer that vanished); the windows stay libp2p's.
func TestMuxerMeasuresRoundTripsRarelyAndSendsNoKeepalives(t *testing.T) {
	got, want := *(*goyamux.Config)(muxer), *(*goyamux.Config)(yamux.DefaultTransport)
	if got.MeasureRTTInterval != rttInterval || rttInterval < 5*time.Minute {
		t.Fatalf("round trips measured every %v, want every %v (at least 5 minutes)", got.MeasureRTTInterval, rttInterval)
	}
	if got.EnableKeepAlive {
		t.Fatalf("yamux keepalives on (every %v), want off", got.KeepAliveInterval)
	}
	want.MeasureRTTInterval, want.EnableKeepAlive = rttInterval, false
	if got != want {
		t.Fatalf("muxer config %+v, want libp2p's but the round trips and keepalives: %+v", got, want)
	}
}

// A node no trusted writer admitted gets a few call streams, reset as they
// open and counted: it cannot hold the streams members need.
func TestStrangerGetsFewCallStreams(t *testing.T) {
	c := quietLoopbackConfig(t, "a")
	c.Trusted = []string{identity(t, c).String()}
	a := startNode(t, c)
	_, ai := tcpListenAddr(t, a)
	stranger := lightHost(t)
	if err := connectWithin(stranger, ai, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	const opened = 3 * plugins.StrangerCallStreams
	var reset atomic.Int64
	for range opened {
		st, err := stranger.NewStream(context.Background(), a.ID(), plugins.ProtocolID)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Reset() })
		if _, err := st.Write([]byte{100}); err != nil { // a request's first byte, and no more
			t.Fatal(err)
		}
		go func() {
			if _, err := st.Read(make([]byte, 1)); errors.Is(err, network.ErrReset) {
				reset.Add(1)
			}
		}()
	}
	waitFor(t, "the stranger's streams past its share reset", func() bool {
		return reset.Load() >= opened-plugins.StrangerCallStreams && a.rejected()["call_unauthorized"] == opened-plugins.StrangerCallStreams
	})
}
