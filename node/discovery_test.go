package node

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/core/routing"
	ma "github.com/multiformats/go-multiaddr"
)

// TestAdvertiseChance: every node of a small fleet advertises, about
// advertisers nodes of a large one, whatever its size.
func TestAdvertiseChance(t *testing.T) {
	for _, n := range []int{0, 1, 2, advertisers} {
		if got := advertiseChance(n); got != 1 {
			t.Errorf("advertiseChance(%d) = %v, want 1", n, got)
		}
	}
	for _, n := range []int{advertisers + 1, 50, 1000, 5000} {
		got := advertiseChance(n)
		if got <= 0 || got >= 1 || math.Abs(got*float64(n)-advertisers) > 1e-9 {
			t.Errorf("advertiseChance(%d) = %v: %v advertisers a round, want %d", n, got, got*float64(n), advertisers)
		}
	}
}

// TestDHTStartAt: a node starts its DHT from 3 to 9 discovery intervals
// after its own start, spread evenly.
func TestDHTStartAt(t *testing.T) {
	const interval = 10 * time.Second
	for _, c := range []struct {
		r    float64
		want time.Duration
	}{{0, 30 * time.Second}, {0.5, time.Minute}, {0.999999, 90 * time.Second}} {
		if got := dhtStartAt(c.r, interval); (got - c.want).Abs() > time.Millisecond {
			t.Errorf("dhtStartAt(%v, %v) = %v, want %v", c.r, interval, got, c.want)
		}
	}
}

// A node with enough peers starts its DHT only from 3 discovery
// intervals after its start; one short of peers starts it after a round,
// to look the fleet up, long before its own 3 intervals. Times are taken
// from each node's start; c's interval is long, so that a busy machine
// cannot blur its round into its timed start.
func TestDHTStartsLateUnlessShort(t *testing.T) {
	kad := protocol.ID("/tribe/kad/1.0.0")
	speaksDHT := func(n *Node) bool { return slices.Contains(n.Host().Mux().Protocols(), kad) }
	ca := loopbackConfig(t, "a")
	ca.TargetPeers = 1
	a := startNode(t, ca)
	cb := loopbackConfig(t, "b")
	cb.DiscoveryInterval, cb.TargetPeers, cb.Join = 500*time.Millisecond, 1, []string{tcpAddr(a)}
	bStart := time.Now()
	b := startNode(t, cb)
	cc := loopbackConfig(t, "c") // wants 5 peers, can have 2: short
	cc.DiscoveryInterval, cc.TargetPeers, cc.Join = 10*time.Second, 5, []string{tcpAddr(a)}
	c := startNode(t, cc)
	cStarted := time.Now()
	var bDHT, cDHT time.Duration
	for deadline := time.Now().Add(time.Minute); bDHT == 0 || cDHT == 0; time.Sleep(10 * time.Millisecond) {
		if cDHT == 0 && speaksDHT(c) {
			cDHT = time.Since(cStarted)
		}
		if bDHT == 0 && speaksDHT(b) {
			bDHT = time.Since(bStart)
		}
		if time.Now().After(deadline) {
			t.Fatalf("DHTs after a minute: b %v, c %v", bDHT, cDHT)
		}
	}
	if cDHT >= 3*cc.DiscoveryInterval {
		t.Errorf("c, short of peers, started its DHT %v after its start, not after a round", cDHT)
	}
	if bDHT < 3*cb.DiscoveryInterval {
		t.Errorf("b, with its peer, started its DHT %v after its start, before 3 intervals", bDHT)
	}
}

// A rendezvous lookup's peers are dialled only if they count: anyone may
// advertise under the key. A new node knows no admissions but finds the
// trusted writers.
func TestRendezvousPeersThatDoNotCountAreNotDialled(t *testing.T) {
	writer, stranger := newPeerID(t), newPeerID(t)
	c := loopbackConfig(t, "b")
	c.Trusted = []string{writer.String()}
	n, err := New(c, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	addrs := []ma.Multiaddr{ma.StringCast("/ip4/127.0.0.1/tcp/9")}
	got := n.rendezvousPeers([]peer.AddrInfo{{ID: stranger, Addrs: addrs}, {ID: writer, Addrs: addrs}})
	if len(got) != 1 || got[0].ID != writer {
		t.Fatalf("rendezvous peers to dial: %v, want only the trusted writer %v", got, writer)
	}
}

// The DHT keeps no values: a peer cannot store records of made-up keys on
// this node (the node uses the DHT for rendezvous and peers only).
func TestDHTKeepsNoValues(t *testing.T) {
	n := startNode(t, loopbackConfig(t, "a"))
	kad, err := n.newDHT()
	if err != nil {
		t.Fatal(err)
	}
	defer kad.Close()
	if err := kad.PutValue(context.Background(), "/pk/x", []byte("v")); !errors.Is(err, routing.ErrNotSupported) {
		t.Fatalf("PutValue: %v, want routing.ErrNotSupported", err)
	}
}
