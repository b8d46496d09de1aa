package node

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/gossip/swim"
)

// swimSend opens a probe stream from h's node to to and sends b; it
// returns the answer's frame, or an error if the stream was reset.
func swimSend(t *testing.T, from *Node, to peer.ID, b []byte) (swim.Frame, error) {
	t.Helper()
	s, err := from.host.NewStream(context.Background(), to, SwimProtocol)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(5 * time.Second))
	s.Write(b)
	s.CloseWrite()
	return readSwimFrame(s, false)
}

// The failure detector's input from a peer that can connect but does not
// count: garbage, its own claims, a ping-req for a target it names. Each
// is refused and counted (or answered nack); it is not even a member.
func TestSwimRefusesStrangers(t *testing.T) {
	admin, stranger := adminAndStranger(t)
	bad := func() int64 { return admin.swim.bad.Load() }

	if _, err := swimSend(t, stranger, admin.ID(), []byte{9, 9, 9}); err == nil {
		t.Error("garbage was answered")
	}
	if bad() != 1 {
		t.Errorf("bad_swim = %d after garbage, want 1", bad())
	}

	// The stranger, pending, says it left: its word counts for nothing.
	u := swim.Update{Node: string(stranger.ID()), State: swim.Left, Incarnation: 1 << 50, From: string(stranger.ID())}
	u.Sig, _ = stranger.key.Sign(swimSigned(u))
	if _, err := swimSend(t, stranger, admin.ID(), swim.AppendFrame(nil, swim.Frame{Kind: swim.KindPing, Msg: swim.Message{Updates: []swim.Update{u}}})); err != nil {
		t.Fatalf("a ping: %v", err)
	}
	if s, known := admin.swim.d.State(string(stranger.ID())); known {
		t.Errorf("the stranger is a member of the admin's detector, %v", s)
	}
	if bad() != 2 {
		t.Errorf("bad_swim = %d, want 2", bad())
	}
	if st, _ := admin.Status(context.Background()); st.Rejected["bad_swim"] != 2 {
		t.Errorf("status says bad_swim %d, want 2", st.Rejected["bad_swim"])
	}

	// A ping-req for a node the admin does not know: nack, and no dial.
	ans, err := swimSend(t, stranger, admin.ID(), swim.AppendFrame(nil, swim.Frame{Kind: swim.KindPingReq, Target: "nobody"}))
	if err != nil || ans.Kind != swim.KindNack {
		t.Errorf("a ping-req for a stranger's target: %+v, %v; want a nack", ans, err)
	}
}

// What a stranger's pings and hellos leave behind: its pings are answered
// with a plain ack (this node's gossip, each update sent a bounded number
// of times, is for its members: a stranger's pings spent it), and once
// gone it is neither in the peer book nor among the nodes heard from
// (identities cost nothing: each one stayed for good).
func TestStrangersGetNoGossipAndLeaveNoTrace(t *testing.T) {
	admin, stranger := adminAndStranger(t)
	ping := swim.AppendFrame(nil, swim.Frame{Kind: swim.KindPing})
	for range 20 {
		admin.swim.d.Announce(uint64(admin.now().UnixMilli()) + 1<<20) // something to tell
		ans, err := swimSend(t, stranger, admin.ID(), ping)
		if err != nil || ans.Kind != swim.KindAck || len(ans.Msg.Updates) != 0 {
			t.Fatalf("a stranger's ping answered %+v, %v; want a plain ack", ans, err)
		}
	}
	before := admin.peers.size()
	const k = 10
	var gone []peer.ID
	for range k {
		h := bareHostConnectedTo(t, admin)
		s, err := h.NewStream(context.Background(), admin.ID(), HelloProtocol)
		if err != nil {
			t.Fatal(err)
		}
		writeHello(s, helloMsg{hello: hello{Name: "x", Cluster: admin.cfg.Cluster, Version: "v"}})
		readHello(s)
		s.Close()
		if s, err = h.NewStream(context.Background(), admin.ID(), SwimProtocol); err == nil {
			s.Write(ping)
			s.CloseWrite()
			readSwimFrame(s, false)
		}
		gone = append(gone, h.ID())
		h.Close()
	}
	waitFor(t, "the strangers' hellos to be forgotten", func() bool { return admin.peers.size() <= before })
	for _, p := range append(gone, stranger.ID()) {
		if _, heard, _ := admin.swimView(p); !heard.IsZero() {
			t.Errorf("%s, a stranger, is among the nodes heard from", p)
		}
	}
}

// A forged claim changes nothing and is counted; a signed claim by a node
// that counts changes the view, and the node it is about refutes it.
func TestSwimForgeryAndRefutation(t *testing.T) {
	a, b := swimPair(t)
	// In a's name, signed with b's key: a forgery.
	inc := uint64(time.Now().UnixMilli()) + 1000 // past a's and b's own
	f := swim.Update{Node: string(b.ID()), State: swim.Dead, Incarnation: inc, From: string(a.ID())}
	f.Sig, _ = b.key.Sign(swimSigned(f))
	swimSend(t, b, a.ID(), swim.AppendFrame(nil, swim.Frame{Kind: swim.KindPing, Msg: swim.Message{Updates: []swim.Update{f}}}))
	if s, _ := a.swim.d.State(string(b.ID())); s != swim.Alive || a.swim.bad.Load() != 1 {
		t.Fatalf("after a forged death b is %v on a, bad_swim %d (want alive, 1)", s, a.swim.bad.Load())
	}

	// b suspects a of an incarnation above a's own: a must bump past it.
	u := swim.Update{Node: string(a.ID()), State: swim.Suspect, Incarnation: inc, From: string(b.ID())}
	u.Sig, _ = b.key.Sign(swimSigned(u))
	if _, err := swimSend(t, b, a.ID(), swim.AppendFrame(nil, swim.Frame{Kind: swim.KindPing, Msg: swim.Message{Updates: []swim.Update{u}}})); err != nil {
		t.Fatal(err)
	}
	b.swim.d.ApplySnapshot([]swim.Update{u}) // b holds a suspect
	if s, _ := b.swim.d.State(string(a.ID())); s != swim.Suspect {
		t.Fatalf("b holds a %v", s)
	}
	waitFor(t, "a to refute and b to hear it", func() bool { return b.liveness(a.ID()) == Alive })
	if a.swim.bad.Load() != 1 || b.swim.bad.Load() != 0 {
		t.Errorf("bad_swim %d and %d, want 1 (the forgery) and 0", a.swim.bad.Load(), b.swim.bad.Load())
	}
}

// A member's claim at an incarnation no node can hold yet (a node starts
// from its start time in milliseconds and adds one per refutation) is
// refused and counted, by the node it accuses and by every other: one at
// swim.MaxIncarnation − 1 made its node refute at MaxIncarnation, which
// everyone refuses, so a healthy node was suspect, then dead, for good.
func TestSwimRefusesIncarnationsFromTheFuture(t *testing.T) {
	a, b := swimPair(t)
	far := uint64(time.Now().Add(gossip.MaxClockSkew + time.Minute).UnixMilli())
	for _, inc := range []uint64{swim.MaxIncarnation - 1, far} {
		u := swim.Update{Node: string(a.ID()), State: swim.Suspect, Incarnation: inc, From: string(b.ID())}
		u.Sig = b.swimConfig().Sign(u)
		badA, badB := a.swim.bad.Load(), b.swim.bad.Load()
		if _, err := swimSend(t, b, a.ID(), swim.AppendFrame(nil, swim.Frame{Kind: swim.KindPing, Msg: swim.Message{Updates: []swim.Update{u}}})); err != nil {
			t.Fatal(err)
		}
		b.swim.d.ApplySnapshot([]swim.Update{u})
		if s, _ := b.swim.d.State(string(a.ID())); s != swim.Alive {
			t.Fatalf("b holds a %v after a claim at incarnation %d", s, inc)
		}
		if c := a.swim.d.Stats().Counts; c.Refuted != 0 {
			t.Fatalf("a refuted a claim at incarnation %d", inc)
		}
		if a.swim.bad.Load() != badA+1 || b.swim.bad.Load() != badB+1 {
			t.Fatalf("bad_swim rose by %d on a and %d on b, want 1 and 1", a.swim.bad.Load()-badA, b.swim.bad.Load()-badB)
		}
	}
}

// A peer that does not count holds at most swimStrangers of the probe
// streams served at once; more are reset as they open and counted
// (swim_busy). Each stream takes its slot before its frame is read, for
// up to a probe interval: one stranger's silent streams held every slot,
// and every member's probe was answered busy, its gossip not taken.
func TestStrangersHoldFewSwimSlots(t *testing.T) {
	ca, cb := loopbackConfig(t, "a"), loopbackConfig(t, "b")
	ca.ProbeInterval, cb.ProbeInterval = time.Minute, time.Minute // held streams wait for the test's end
	ca.Trusted = []string{identity(t, ca).String(), identity(t, cb).String()}
	cb.Trusted = ca.Trusted
	a := startNode(t, ca)
	cb.Join = []string{tcpAddr(a)}
	b := startNode(t, cb)
	cs := loopbackConfig(t, "stranger")
	cs.Trusted, cs.Join = ca.Trusted, []string{tcpAddr(a)}
	stranger := startNode(t, cs)
	waitFor(t, "b and the stranger to connect", func() bool { return a.isConnected(b.ID()) && a.isConnected(stranger.ID()) })
	busy0 := a.swim.busy.Load()
	var reset atomic.Int64
	for range swimServing {
		s, err := stranger.host.NewStream(t.Context(), a.ID(), SwimProtocol)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Reset() })
		s.Write([]byte{byte(swim.KindPing)})
		go func() {
			if _, err := s.Read(make([]byte, 1)); errors.Is(err, network.ErrReset) {
				reset.Add(1)
			}
		}()
	}
	waitFor(t, "the stranger's streams past its share reset", func() bool { return reset.Load() == swimServing-swimStrangers })
	if got := a.swim.busy.Load() - busy0; got != swimServing-swimStrangers {
		t.Errorf("swim_busy rose by %d, want %d", got, swimServing-swimStrangers)
	}
	if _, err := b.swimExchange(t.Context(), a.ID(), swim.Frame{Kind: swim.KindPing}); err != nil {
		t.Fatalf("a member's probe while the stranger holds its streams: %v", err)
	}
}

// A node with no room to serve a probe answers it busy, which the prober
// takes for alive (swim.ErrBusy), and counts it (swim_busy), on a kept
// stream as on one of its own; a ping-req it cannot carry out, or a probe
// on a stream of its own past the busy answers' bound, is reset.
func TestBusyNodeAnswersAlive(t *testing.T) {
	a := startNode(t, loopbackConfig(t, "a"))
	cb := loopbackConfig(t, "b")
	cb.Join = []string{tcpAddr(a)}
	b := startNode(t, cb)
	waitFor(t, "a and b to know each other", func() bool { return len(a.nodeRecords()) == 2 && len(b.nodeRecords()) == 2 })
	ping := swim.Frame{Kind: swim.KindPing}
	if _, err := b.swimExchange(t.Context(), a.ID(), ping); err != nil {
		t.Fatalf("a probe of an idle node: %v", err)
	}
	for range swimServing { // every slot taken
		a.swim.serving <- struct{}{}
	}
	busy0 := a.swim.busy.Load()
	_, err := b.swimExchange(t.Context(), a.ID(), ping)
	if !errors.Is(err, swim.ErrBusy) {
		t.Fatalf("a probe of a node with no room: %v, want swim.ErrBusy", err)
	}
	// b's own detector may probe a meanwhile: at least this one counted.
	if got := a.swim.busy.Load() - busy0; got < 1 {
		t.Errorf("swim_busy rose by %d, want at least 1", got)
	}
	ans, err := swimSend(t, b, a.ID(), swim.AppendFrame(nil, swim.Frame{Kind: swim.KindPingReq, Target: string(b.ID())}))
	if err == nil {
		t.Errorf("a ping-req to a node with no room was answered %+v, want a reset", ans)
	}
	for range swimBusyAnswers { // and every busy answer
		a.swim.refusing <- struct{}{}
	}
	if ans, err := swimSend(t, b, a.ID(), swim.AppendFrame(nil, ping)); err == nil {
		t.Errorf("a probe past the busy answers' bound was answered %+v, want a reset", ans)
	}
	if _, err := b.swimExchange(t.Context(), a.ID(), ping); !errors.Is(err, swim.ErrBusy) {
		t.Errorf("a probe on the kept stream past the bound: %v, want swim.ErrBusy (its stream answers its own)", err)
	}
	for range swimBusyAnswers {
		<-a.swim.refusing
	}
	for range swimServing {
		<-a.swim.serving
	}
	if _, err := b.swimExchange(t.Context(), a.ID(), ping); err != nil {
		t.Fatalf("a probe once there is room again: %v", err)
	}
}

// Reach connects to a member before the timed probe, and the probe that
// follows closes the connection as it would have closed its own: a node
// at its target of peers does not keep what its probes opened.
func TestReachedConnectionReleasedAfterTheProbe(t *testing.T) {
	a := startNode(t, loopbackConfig(t, "a"))
	var others []*Node
	for _, name := range []string{"b", "c"} {
		c := loopbackConfig(t, name)
		c.Join, c.TargetPeers = []string{tcpAddr(a)}, 1
		others = append(others, startNode(t, c))
	}
	b, c := others[0], others[1]
	waitFor(t, "b to know c", func() bool { _, ok := b.swim.d.State(string(c.ID())); return ok && len(b.nodeRecords()) == 3 })
	if b.isConnected(c.ID()) {
		b.host.Network().ClosePeer(c.ID())
	}
	if err := (swimTransport{b}).Reach(t.Context(), string(c.ID())); err != nil {
		t.Fatalf("Reach: %v", err)
	}
	if !b.isConnected(c.ID()) {
		t.Fatal("Reach did not connect")
	}
	if _, err := (swimTransport{b}).Ping(t.Context(), string(c.ID()), swim.Message{}); err != nil {
		t.Fatalf("the probe after Reach: %v", err)
	}
	if b.isConnected(c.ID()) {
		t.Error("the connection Reach opened outlived its probe, with b past its target of 1 peer")
	}
}

// A member the failure detector holds dead for deadCloseAfter has its
// connections closed (yamux sends no keepalives that would find a vanished
// host); one that refutes within it keeps them, as does one only suspect.
// The claims are made by hand, signed as the detectors sign them: a's
// accusations, b's refutations.
func TestDeadMemberConnectionsClosed(t *testing.T) {
	old := deadCloseAfter
	deadCloseAfter = 2 * time.Second
	t.Cleanup(func() { deadCloseAfter = old })
	// Neither probes nor gossips (the first round waits a fifth of the
	// interval): b closes nothing and refutes only what it is told; a
	// tells it nothing but the claims below make it (a gossip round of
	// a's could carry b its own death just after a claim, and b's
	// refutation could reach a before the test reads a's view).
	ca := loopbackConfig(t, "a")
	ca.ProbeInterval = time.Hour
	a := startNode(t, ca)
	c := loopbackConfig(t, "b")
	c.Join = []string{tcpAddr(a)}
	c.ProbeInterval = time.Hour
	b := startNode(t, c)
	// A member a holds, alive, and its record: a claim that b is alive
	// counts only once a holds b's record, and State reads a node it
	// does not know as alive (the zero State).
	waitFor(t, "a to hold b alive, and its record", func() bool {
		st, ok := a.swim.d.State(string(b.ID()))
		_, rec := a.replica.Get(nodesPrefix + b.ID().String())
		return a.isConnected(b.ID()) && ok && st == swim.Alive && rec
	})
	closed := make(chan struct{}, 64)
	a.host.Network().Notify(&network.NotifyBundle{DisconnectedF: func(_ network.Network, cn network.Conn) {
		if cn.RemotePeer() == b.ID() {
			closed <- struct{}{}
		}
	}})
	inc := uint64(time.Now().UnixMilli()) + 1000 // past b's own
	claim := func(by *Node, state swim.State) {
		u := swim.Update{Node: string(b.ID()), State: state, Incarnation: inc, From: string(by.ID())}
		u.Sig = by.swimConfig().Sign(u)
		a.swim.d.HandlePing(string(by.ID()), swim.Message{Updates: []swim.Update{u}})
		// a tells a suspect at once, and b refutes (one incarnation up,
		// the next claim's): a may hold it alive again already. So may
		// it after a death, on a loaded machine, if b heard of it and
		// its refutation came back before this check: then a holds b
		// alive above the claim's incarnation.
		st, known := a.swim.d.State(string(b.ID()))
		switch {
		case st == state, st == swim.Alive && state == swim.Suspect:
		case st == swim.Alive && refutedAbove(a, b.ID(), inc):
			t.Logf("b refuted the claim that it is %v before the test read a's view", state)
		default:
			us := a.swim.d.Corrections([]swim.Update{{Node: string(b.ID()), State: swim.Dead, Incarnation: 0}})
			t.Fatalf("a holds b %v (a member: %v) after the claim that it is %v (incarnation %d); the last update it applied about b: %+v", st, known, state, inc, us)
		}
	}
	noClose := func(what string) {
		t.Helper()
		select {
		case <-closed:
			t.Fatalf("a closed its connection to b, %s", what)
		case <-time.After(deadCloseAfter + time.Second):
		}
	}

	claim(a, swim.Suspect)
	inc++
	claim(b, swim.Alive)
	claim(a, swim.Dead)
	inc++
	claim(b, swim.Alive) // within deadCloseAfter
	noClose("which was suspect, and refuted its death")

	claim(a, swim.Dead)
	select {
	case <-closed:
		t.Fatal("a closed its connection to b at once, not after deadCloseAfter")
	case <-time.After(deadCloseAfter / 2):
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		st, _ := a.swim.d.State(string(b.ID()))
		t.Fatalf("a did not close its connection to b, held %v", st)
	}
}

// refutedAbove reports whether n holds p alive at an incarnation above
// inc: p refuted a claim made at inc.
func refutedAbove(n *Node, p peer.ID, inc uint64) bool {
	us := n.swim.d.Corrections([]swim.Update{{Node: string(p), State: swim.Dead, Incarnation: inc}})
	return len(us) == 1 && us[0].State == swim.Alive && us[0].Incarnation > inc
}

// A helper's nack to a ping-req carries what it knows of the target that
// is final (it left, or is dead): the requester takes the message along
// with the nack.
func TestNackCarriesItsMessage(t *testing.T) {
	a := startNode(t, loopbackConfig(t, "a"))
	left := swim.Update{Node: "gone", State: swim.Left, From: "gone", Sig: []byte("sig")}
	m, err := a.swimAnswer("helper", swim.Frame{Kind: swim.KindPingReq, Target: "gone"},
		swim.Frame{Kind: swim.KindNack, Msg: swim.Message{Updates: []swim.Update{left}}})
	if !errors.Is(err, swim.ErrNack) || len(m.Updates) != 1 || m.Updates[0].State != swim.Left {
		t.Fatalf("a nack read as %+v, %v; want its left update and ErrNack", m, err)
	}
}

// swimPair is two nodes on loopback, b joined to a, once each holds the
// other in its failure detector.
func swimPair(t *testing.T) (a, b *Node) {
	t.Helper()
	return joinedPair(t, func(a, b *Node) bool {
		_, ok1 := a.swim.d.State(string(b.ID()))
		_, ok2 := b.swim.d.State(string(a.ID()))
		return ok1 && ok2
	})
}
