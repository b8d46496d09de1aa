package node

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/protocol"
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
// intervals on; one short of peers starts it after a round, to look the
// fleet up.
func TestDHTStartsLateUnlessShort(t *testing.T) {
	kad := protocol.ID("/tribe/kad/1.0.0")
	speaksDHT := func(n *Node) bool { return slices.Contains(n.Host().Mux().Protocols(), kad) }
	const interval = 300 * time.Millisecond
	ca := loopbackConfig(t, "a")
	ca.DiscoveryInterval, ca.TargetPeers = interval, 1
	a := startNode(t, ca)
	cb := loopbackConfig(t, "b")
	cb.DiscoveryInterval, cb.TargetPeers, cb.Join = interval, 1, []string{tcpAddr(a)}
	b := startNode(t, cb)
	cc := loopbackConfig(t, "c")
	cc.DiscoveryInterval, cc.TargetPeers, cc.Join = interval, 5, []string{tcpAddr(a)}
	c := startNode(t, cc)
	begin := time.Now()
	waitFor(t, "b to have its peer", func() bool { return len(b.ConnectedPeers()) >= 1 })
	waitFor(t, "c, short of peers, to start its DHT", func() bool { return speaksDHT(c) })
	if speaksDHT(b) && time.Since(begin) < 3*interval {
		t.Fatalf("b, not short of peers, started its DHT after %v, before 3 intervals (%v)", time.Since(begin), 3*interval)
	}
	waitFor(t, "b to start its DHT", func() bool { return speaksDHT(b) })
	if took := time.Since(begin); took < 2*interval {
		t.Fatalf("b started its DHT after %v", took)
	}
}
