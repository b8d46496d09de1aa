package node

import (
	"crypto/rand"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

func randomPeer(t *testing.T) peer.ID {
	t.Helper()
	_, pub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestMDNSGate(t *testing.T) {
	var g mdnsGate
	a, b := randomPeer(t), randomPeer(t)
	if !g.admit(a, 0, 128) {
		t.Fatal("the first find is not dialled")
	}
	if g.admit(a, 0, 128) || g.skipped.Load() != 0 {
		t.Error("a find being dialled is dialled again, or counted as skipped")
	}
	if g.admit(b, 128, 128) || g.skipped.Load() != 1 {
		t.Error("a find is dialled with ConnHigh peers already")
	}
	for range mdnsDialsInFlight - 1 {
		if !g.admit(randomPeer(t), 0, 128) {
			t.Fatal("a find is skipped below the cap")
		}
	}
	if g.admit(b, 0, 128) || g.skipped.Load() != 2 {
		t.Errorf("a find past %d in flight is dialled", mdnsDialsInFlight)
	}
	g.done(a)
	if !g.admit(b, 0, 128) {
		t.Error("a find is skipped once a slot is free")
	}
}

// A burst of mDNS finds (a LAN booting) starts at most mdnsDialsInFlight
// dials at once; the rest are skipped and counted.
func TestMDNSFindsAreDialledThroughTheGate(t *testing.T) {
	n := startNode(t, loopbackConfig(t, "a"))
	addr := ma.StringCast("/ip4/127.0.0.1/tcp/1") // refused at once
	const finds = 100
	for range finds {
		mdnsNotifee{n}.HandlePeerFound(peer.AddrInfo{ID: randomPeer(t), Addrs: []ma.Multiaddr{addr}})
	}
	waitFor(t, "the dials to end", func() bool {
		n.mdnsGate.mu.Lock()
		defer n.mdnsGate.mu.Unlock()
		return n.mdnsGate.inFlight == 0
	})
	dialled, skipped := n.mdnsGate.dialled.Load(), n.mdnsGate.skipped.Load()
	if n.mdnsGate.maxSeen > mdnsDialsInFlight || dialled+skipped != finds || dialled < mdnsDialsInFlight {
		t.Errorf("%d dialled, %d skipped of %d finds, %d at once; want at most %d at once", dialled, skipped, finds, n.mdnsGate.maxSeen, mdnsDialsInFlight)
	}
	if st, _ := n.Status(t.Context()); st.Rejected["mdns_finds_skipped"] != skipped {
		t.Errorf("status counts %d skipped finds, want %d", st.Rejected["mdns_finds_skipped"], skipped)
	}
}
