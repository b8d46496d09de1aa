package gossip

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
)

// pushRaw sends raw over the push protocol from h to the replica and
// returns its one-byte answer (-1 for none).
func pushRaw(t *testing.T, n *testNet, h host.Host, raw []byte) int {
	t.Helper()
	s, err := h.NewStream(context.Background(), n.h.ID(), PushProtocol)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Write(raw)
	s.CloseWrite()
	var ack [1]byte
	if _, err := io.ReadFull(s, ack[:]); err != nil {
		return -1
	}
	return int(ack[0])
}

// TestPushTakesOnlyTheSendersOwnEntries: a peer's own record is stored
// and acknowledged; another node's entry, a forged one and one over the
// size limit are refused and counted.
func TestPushTakesOnlyTheSendersOwnEntries(t *testing.T) {
	n := newTestNet(t)
	a, b := n.peer(t), n.peer(t)
	if got := pushRaw(t, n, a, ownRecord(t, a)); got != 1 {
		t.Fatalf("own record: answer %d, want 1", got)
	}
	if _, ok := n.r.Get("nodes/" + a.ID().String()); !ok {
		t.Fatal("own record pushed and acknowledged but not stored")
	}
	if got := pushRaw(t, n, b, ownRecord(t, a)); got != 0 {
		t.Fatalf("another's record: answer %d, want 0", got)
	}
	if got := pushRaw(t, n, b, forged(t, b)); got != 0 {
		t.Fatalf("forged record: answer %d, want 0", got)
	}
	if got := pushRaw(t, n, b, make([]byte, MaxEntrySize+1)); got != 0 {
		t.Fatalf("oversized: answer %d, want 0", got)
	}
	if _, ok := n.r.Get("nodes/" + b.ID().String()); ok {
		t.Fatal("a refused push was stored")
	}
	rej := n.r.Rejected()
	if rej["unauthorized"] != 1 || rej["bad_signature"] != 1 || rej["too_large"] != 1 || rej["malformed"] != 0 {
		t.Fatalf("refused pushes not counted by reason (another's entry: unauthorized, forged: bad_signature, oversized: too_large): %v", rej)
	}
}

// replicaPair is two replicas on one mock network, m linked to n (and
// connected too, if connect).
func replicaPair(t *testing.T, connect bool) (n, m *testNet) {
	t.Helper()
	return pairOf(t, &testNet{}, &testNet{}, connect)
}

// pairOf starts n and m, set up but for their hosts and network, as
// replicaPair's.
func pairOf(t *testing.T, n, m *testNet, connect bool) (*testNet, *testNet) {
	t.Helper()
	n.mn = mocknet.New()
	startTestNet(t, n)
	m.mn = n.mn
	h, err := genPeer(n.mn)
	if err != nil {
		t.Fatal(err)
	}
	m.start(t, h)
	if _, err := n.mn.LinkPeers(h.ID(), n.h.ID()); err != nil {
		t.Fatal(err)
	}
	if connect {
		if _, err := n.mn.ConnectPeers(h.ID(), n.h.ID()); err != nil {
			t.Fatal(err)
		}
	}
	return n, m
}

// TestReplicaPush: Push hands a replica's own entry to a peer replica.
func TestReplicaPush(t *testing.T) {
	n, m := replicaPair(t, false)
	h := m.h
	s, err := m.r.Put(context.Background(), "nodes/"+h.ID().String(), []byte(`{"name":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.r.Push(context.Background(), n.h.ID(), s); err != nil {
		t.Fatal(err)
	}
	if got, ok := n.r.Get(s.Key); !ok || got.Hash != s.Hash {
		t.Fatal("pushed entry not held by the peer")
	}
}

// TestPushIsBounded: a peer gets maxPushingPerPeer pushes at a time; one
// more while those are held open is refused and counted, and those cut
// short are counted.
func TestPushIsBounded(t *testing.T) {
	n := startTestNet(t, &testNet{mn: mocknet.New(), firstRequest: time.Hour}) // held, not stalled
	a := n.peer(t)
	for range maxPushingPerPeer {
		held, err := a.NewStream(context.Background(), n.h.ID(), PushProtocol)
		if err != nil {
			t.Fatal(err)
		}
		held.Write([]byte{0x0a}) // the start of an entry, then nothing
		defer held.Reset()
	}
	waitFor(t, func() bool { return n.r.pushing.InUse() == maxPushingPerPeer })
	if got := pushRaw(t, n, a, ownRecord(t, a)); got != -1 {
		t.Fatalf("one more push while %d are held: answer %d, want a reset", maxPushingPerPeer, got)
	}
	a.Network().ClosePeer(n.h.ID()) // the held ones end, cut short
	waitFor(t, func() bool {
		return n.r.Rejected()["push_cut_short"] == maxPushingPerPeer && n.r.pushing.InUse() == 0
	})
	if got := n.r.Rejected()["push_busy"]; got != 1 {
		t.Fatalf("push_busy = %d, want 1", got)
	}
	if got := pushRaw(t, n, a, ownRecord(t, a)); got != 1 {
		t.Fatalf("a push once the slot is free: answer %d, want 1", got)
	}
}

// TestPutQuietThenAnnounce: an entry written with PutQuiet is stored but
// not published; Announce publishes it. What the topic carries is read
// from a subscription of n's own: n also pulls from m while it joins, and
// such a pull may bring the quiet entry (it failed so once in 200 runs).
func TestPutQuietThenAnnounce(t *testing.T) {
	ctx := context.Background()
	n, m := replicaPair(t, true)
	h := m.h
	waitFor(t, func() bool { return len(m.r.topic.ListPeers()) > 0 && len(n.r.topic.ListPeers()) > 0 })
	sub, err := n.r.topic.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Cancel()
	// published waits for want on the topic, failing if unwanted comes
	// first.
	published := func(want, unwanted *Signed) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		for {
			msg, err := sub.Next(wctx)
			if err != nil {
				t.Fatalf("%s did not come by pubsub: %v", want.Key, err)
			}
			switch {
			case unwanted != nil && bytes.Equal(msg.Data, unwanted.Raw):
				t.Fatalf("%s was published", unwanted.Key)
			case bytes.Equal(msg.Data, want.Raw):
				return
			}
		}
	}
	key := "nodes/" + h.ID().String()
	quiet, err := m.r.PutQuiet(ctx, key, []byte(`{"name":"quiet"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := m.r.Get(key); !ok || got.Hash != quiet.Hash {
		t.Fatal("PutQuiet did not store the entry here")
	}
	// A marker published after it: a published quiet entry, sent first on
	// the same stream, would come before it.
	marker, err := m.r.Put(ctx, "tribes/marker", nil)
	if err != nil {
		t.Fatal(err)
	}
	published(marker, quiet)
	m.r.Announce(ctx, quiet)
	published(quiet, nil)
	waitFor(t, func() bool { got, ok := n.r.Get(key); return ok && got.Hash == quiet.Hash })
}

// TestPushSlotsKeptForPeersThatCount: strangers holding pushes open take
// at most the slots not kept for peers that count; a trusted writer's
// push is still taken.
func TestPushSlotsKeptForPeersThatCount(t *testing.T) {
	mn := mocknet.New()
	trusted, err := genPeer(mn)
	if err != nil {
		t.Fatal(err)
	}
	n := startTestNet(t, &testNet{mn: mn, trust: []peer.ID{trusted.ID()}, firstRequest: time.Hour})
	n.connect(t, trusted)
	const strangers = maxPushing / maxPushingPerPeer
	for range strangers {
		h := n.peer(t)
		for range maxPushingPerPeer {
			s, err := h.NewStream(context.Background(), n.h.ID(), PushProtocol)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Reset()
			s.Write([]byte{0x0a})
		}
	}
	busy := int64(strangers*maxPushingPerPeer - (maxPushing - pushingReserved))
	waitFor(t, func() bool { return n.r.Rejected()["push_busy"] == busy })
	if got := pushRaw(t, n, trusted, ownRecord(t, trusted)); got != 1 {
		t.Fatalf("a trusted writer's push while %d strangers hold pushes: answer %d, want 1", strangers, got)
	}
	wantRejected(t, n.r, map[string]int64{"push_busy": busy})
}

// TestPushStall: a push whose entry does not come whole within
// firstRequest is reset and counted, and frees its slot; a stranger that
// stalls one cools down, a trusted writer does not.
func TestPushStall(t *testing.T) {
	mn := mocknet.New()
	trusted, err := genPeer(mn)
	if err != nil {
		t.Fatal(err)
	}
	n := startTestNet(t, &testNet{mn: mn, trust: []peer.ID{trusted.ID()}, firstRequest: 100 * time.Millisecond})
	n.connect(t, trusted)
	stranger := n.peer(t)
	stall := func(h host.Host, want map[string]int64) {
		t.Helper()
		s, err := h.NewStream(context.Background(), n.h.ID(), PushProtocol)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Reset()
		s.Write([]byte{0x0a}) // the start of an entry, then nothing
		waitRejected(t, n.r, want)
		if t.Failed() {
			t.FailNow()
		}
		if _, err := io.ReadAll(s); !errors.Is(err, network.ErrReset) {
			t.Fatalf("a stalled push: %v, want a reset", err)
		}
	}
	stall(stranger, map[string]int64{"push_cut_short": 1, "sync_penalised": 1})
	if !n.r.Penalised(stranger.ID()) {
		t.Fatal("a stranger that stalled a push is not cooling down")
	}
	stall(trusted, map[string]int64{"push_cut_short": 2, "sync_penalised": 1})
	if n.r.Penalised(trusted.ID()) {
		t.Fatal("a trusted writer was penalised for a stalled push")
	}
	waitFor(t, func() bool { return n.r.pushing.InUse() == 0 })
	if got := pushRaw(t, n, trusted, ownRecord(t, trusted)); got != 1 {
		t.Fatalf("a push after the stall: answer %d, want 1", got)
	}
}
