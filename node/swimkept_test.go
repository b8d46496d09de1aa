package node

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip/swim"
)

// connectedPair starts a and b, b joining a, and waits until each knows
// the other speaks the kept protocol.
func connectedPair(t *testing.T) (a, b *Node) {
	t.Helper()
	return joinedPair(t, func(a, b *Node) bool {
		return len(a.nodeRecords()) == 2 && len(b.nodeRecords()) == 2 && b.swimKeptTo(a.ID(), false) && a.swimKeptTo(b.ID(), false)
	})
}

// joinedPair starts a and b on loopback, b joining a, and waits until
// ready says they know each other as a test needs.
func joinedPair(t *testing.T, ready func(a, b *Node) bool) (a, b *Node) {
	t.Helper()
	a = startNode(t, loopbackConfig(t, "a"))
	cb := loopbackConfig(t, "b")
	cb.Join = []string{tcpAddr(a)}
	b = startNode(t, cb)
	waitFor(t, "a and b to know each other", func() bool { return ready(a, b) })
	return a, b
}

// keptTo is the stream n keeps for pinging p, if any.
func keptTo(n *Node, p peer.ID) network.Stream {
	n.swim.mu.Lock()
	defer n.swim.mu.Unlock()
	if ks := n.swim.kept[p]; ks != nil {
		return ks.s
	}
	return nil
}

// Pings between connected peers share one stream, kept between them.
func TestPingsShareAKeptStream(t *testing.T) {
	a, b := connectedPair(t)
	ping := swim.Frame{Kind: swim.KindPing}
	if _, err := b.swimExchange(t.Context(), a.ID(), ping); err != nil {
		t.Fatal(err)
	}
	first := keptTo(b, a.ID())
	for range 20 {
		if _, err := b.swimExchange(t.Context(), a.ID(), ping); err != nil {
			t.Fatal(err)
		}
	}
	last := keptTo(b, a.ID())
	if first == nil || last != first {
		t.Fatalf("21 pings: kept stream %v then %v, want the same one", first, last)
	}
	// a's own probes of b keep one too; b's to a is one of a's at most two.
	if got := streamsWith(a, b.ID(), SwimKeptProtocol); got < 1 || got > 2 {
		t.Fatalf("a holds %d kept streams with b, want 1 or 2 (one each way)", got)
	}
}

// A kept stream the other end closed (idle, or restarted) costs no probe:
// the ping goes again on a new stream.
func TestClosedKeptStreamIsReplaced(t *testing.T) {
	a, b := connectedPair(t)
	ping := swim.Frame{Kind: swim.KindPing}
	if _, err := b.swimExchange(t.Context(), a.ID(), ping); err != nil {
		t.Fatal(err)
	}
	old := keptTo(b, a.ID())
	// a drops every kept stream b opened to it.
	for _, c := range a.host.Network().ConnsToPeer(b.ID()) {
		for _, s := range c.GetStreams() {
			if s.Protocol() == SwimKeptProtocol && s.Stat().Direction == network.DirInbound {
				s.Reset()
			}
		}
	}
	if _, err := b.swimExchange(t.Context(), a.ID(), ping); err != nil {
		t.Fatalf("a ping after a closed its end: %v", err)
	}
	now := keptTo(b, a.ID())
	if now == nil || now == old {
		t.Fatalf("kept stream %v after the close, want a new one (was %v)", now, old)
	}
}

// Bytes on a kept stream that break the protocol (a length out of bounds,
// a snapshot, an ack where a ping belongs) reset it and are counted; a
// peer holds at most swimKeptPerPeer kept streams to a node.
func TestKeptStreamRefusesBadInput(t *testing.T) {
	a, b := connectedPair(t)
	send := func(raw []byte) (swim.Frame, error) {
		t.Helper()
		s, err := b.host.NewStream(context.Background(), a.ID(), SwimKeptProtocol)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		s.SetDeadline(time.Now().Add(5 * time.Second))
		s.Write(raw)
		return readKeptFrame(bufio.NewReader(s))
	}
	for _, tc := range []struct {
		name string
		raw  []byte
	}{
		{"an empty frame", []byte{0}},
		{"a frame over the limit", binary.AppendUvarint(nil, swim.MaxFrame+1)},
		{"a length over three bytes", []byte{0x80, 0x80, 0x80, 0x01}},
		{"a snapshot", appendKeptFrame(nil, swim.Frame{Kind: swim.KindSync})},
		{"an ack", appendKeptFrame(nil, swim.Frame{Kind: swim.KindAck})},
		{"a ping-req", appendKeptFrame(nil, swim.Frame{Kind: swim.KindPingReq, Target: string(b.ID())})},
	} {
		bad := a.swim.bad.Load()
		if ans, err := send(tc.raw); err == nil {
			t.Errorf("%s: answered %+v, want a reset", tc.name, ans)
		}
		waitFor(t, tc.name+" counted", func() bool { return a.swim.bad.Load() == bad+1 })
	}
	if ans, err := send(appendKeptFrame(nil, swim.Frame{Kind: swim.KindPing})); err != nil || ans.Kind != swim.KindAck {
		t.Fatalf("a ping: %+v, %v; want an ack", ans, err)
	}

	// Past swimKeptPerPeer streams held open at once, the next is reset.
	var held []network.Stream
	ping := appendKeptFrame(nil, swim.Frame{Kind: swim.KindPing})
	for range swimKeptPerPeer + 1 {
		s, err := b.host.NewStream(context.Background(), a.ID(), SwimKeptProtocol)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Reset()
		s.SetDeadline(time.Now().Add(5 * time.Second))
		s.Write(ping)
		if _, err := readKeptFrame(bufio.NewReader(s)); err != nil {
			held = append(held, nil)
			continue
		}
		held = append(held, s)
	}
	// b's own kept stream to a (its detector's probes) may hold a slot.
	if held[len(held)-1] != nil {
		t.Fatalf("%d kept streams from one peer all answered, want at most %d", len(held), swimKeptPerPeer)
	}
}

// Peers that do not count hold at most swimKeptStrangers kept streams to
// a node, all of them together; a peer that counts is not held back by
// them, and a stranger's stream given back makes room for another.
func TestKeptStreamsOfStrangersAreBounded(t *testing.T) {
	n := startNode(t, loopbackConfig(t, "a"))
	ids := make([]peer.ID, swimKeptStrangers+1)
	for i := range ids {
		k, _, err := crypto.GenerateEd25519Key(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		ids[i], _ = peer.IDFromPrivateKey(k)
	}
	for i, id := range ids[:swimKeptStrangers] {
		if !n.keptServe(id, 1, true) {
			t.Fatalf("stranger %d's kept stream refused, want at most %d served", i, swimKeptStrangers)
		}
	}
	last := ids[swimKeptStrangers]
	if n.keptServe(last, 1, true) {
		t.Fatalf("a stranger's kept stream past %d served", swimKeptStrangers)
	}
	if !n.keptServe(last, 1, false) {
		t.Fatal("a peer that counts was refused for strangers' streams")
	}
	n.keptServe(ids[0], -1, true)
	if !n.keptServe(last, 1, true) {
		t.Fatal("a stranger's stream given back made no room")
	}
}

// A peer that does not speak the kept protocol (an agent of an earlier
// version) is pinged on streams of their own.
func TestPingWithoutKeptProtocol(t *testing.T) {
	a, b := connectedPair(t)
	a.host.RemoveStreamHandler(SwimKeptProtocol)
	waitFor(t, "b to hear a dropped the protocol", func() bool { return !b.swimKeptTo(a.ID(), false) })
	if _, err := b.swimExchange(t.Context(), a.ID(), swim.Frame{Kind: swim.KindPing}); err != nil {
		t.Fatalf("a ping to a peer without kept streams: %v", err)
	}
}

// FuzzReadKeptFrame: a kept stream's bytes come from any peer that can
// connect.
func FuzzReadKeptFrame(f *testing.F) {
	f.Add(appendKeptFrame(nil, swim.Frame{Kind: swim.KindPing}))
	f.Add(appendKeptFrame(nil, swim.Frame{Kind: swim.KindAck, Msg: swim.Message{Updates: []swim.Update{{Node: "x", State: swim.Alive, Incarnation: 3, From: "x"}}}}))
	f.Add(appendKeptFrame(nil, swim.Frame{Kind: swim.KindSync}))
	f.Add(binary.AppendUvarint(nil, swim.MaxFrame+1))
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := readKeptFrame(bufio.NewReader(bytes.NewReader(b)))
		if err != nil {
			return
		}
		if fr.Kind == swim.KindSync {
			t.Fatalf("a snapshot accepted on a kept stream from %q", b)
		}
		again, err := readKeptFrame(bufio.NewReader(bytes.NewReader(appendKeptFrame(nil, fr))))
		if err != nil || again.Kind != fr.Kind || again.Target != fr.Target || len(again.Msg.Updates) != len(fr.Msg.Updates) {
			t.Fatalf("%+v does not survive its own encoding: %+v, %v", fr, again, err)
		}
	})
}

// A kept frame's length alone buys no memory: the frame grows as its
// bytes arrive.
func TestKeptFrameLengthBuysNoMemory(t *testing.T) {
	raw := append(binary.AppendUvarint(nil, swim.MaxFrame), 1, 2, 3)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		if _, err := readKeptFrame(bufio.NewReaderSize(bytes.NewReader(raw), 16)); err == nil {
			t.Fatal("a frame cut short was read")
		}
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 100*swim.MaxFrame/4 {
		t.Fatalf("100 frames announcing %d bytes and sending 3 allocated %d bytes", swim.MaxFrame, got)
	}
}
