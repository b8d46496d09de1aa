package gossip

import (
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

func TestCooldown(t *testing.T) {
	var c cooldown
	a, b := peer.ID("a"), peer.ID("b")
	if c.active(a, t0) {
		t.Fatal("a peer never penalised is cooling down")
	}
	c.penalise(a, t0, SyncCooldown)
	for _, tc := range []struct {
		p    peer.ID
		at   time.Duration
		want bool
	}{
		{a, 0, true},
		{a, SyncCooldown - time.Nanosecond, true},
		{a, SyncCooldown, false},
		{b, 0, false},
	} {
		if got := c.active(tc.p, t0.Add(tc.at)); got != tc.want {
			t.Errorf("active(%s, +%v) = %v, want %v", tc.p, tc.at, got, tc.want)
		}
	}
	// Ended penalties are dropped when another is given.
	c.penalise(b, t0.Add(SyncCooldown), SyncCooldown)
	if _, ok := c.until[a]; ok || len(c.until) != 1 {
		t.Fatalf("penalties held: %v", c.until)
	}
}

func TestSlots(t *testing.T) {
	s := NewSlots(maxServing, maxServingPerPeer)
	taken := 0
	for i := range maxServing {
		p := peer.ID(rune('a' + i/maxServingPerPeer))
		for range maxServingPerPeer {
			if s.Acquire(p) {
				taken++
			}
		}
	}
	if taken != maxServing || s.InUse() != maxServing {
		t.Fatalf("%d slots taken, %d in use, want %d", taken, s.InUse(), maxServing)
	}
	if s.Acquire("z") {
		t.Fatal("a slot beyond maxServing")
	}
	for _, p := range []peer.ID{"a", "b", "c"} {
		s.Release(p)
	}
	for range maxServingPerPeer {
		if !s.Acquire("z") {
			t.Fatal("a released slot was not given again")
		}
	}
	if s.Acquire("z") {
		t.Fatal("one peer got more than maxServingPerPeer")
	}
	if s.InUse() != maxServing-1 {
		t.Fatalf("%d in use, want %d", s.InUse(), maxServing-1)
	}
}

func TestWarnLimit(t *testing.T) {
	var w warnLimit
	a, b := peer.ID("a"), peer.ID("b")
	for i, tc := range []struct {
		p    peer.ID
		at   time.Duration
		want bool
		held int
	}{
		{a, 0, true, 0},
		{a, time.Second, false, 0},
		{b, time.Second, true, 0},
		{a, warnEvery - time.Nanosecond, false, 0},
		{a, warnEvery, true, 2},
		{a, warnEvery + time.Second, false, 0},
		{a, 3 * warnEvery, true, 1},
	} {
		if got, held := w.allow(tc.p, t0.Add(tc.at), warnEvery); got != tc.want || held != tc.held {
			t.Errorf("%d: allow(%s, +%v) = %v, %d held; want %v, %d", i, tc.p, tc.at, got, held, tc.want, tc.held)
		}
	}
	// It remembers a bounded number of peers.
	for i := range 3 * maxWarnPeers {
		w.allow(peer.ID(rune(1000+i)), t0, warnEvery)
	}
	if len(w.last) > maxWarnPeers {
		t.Fatalf("%d peers remembered, at most %d", len(w.last), maxWarnPeers)
	}
}

// TestSlotsReserved: a peer that does not count gets none of the
// reserved slots; one that counts gets them.
func TestSlotsReserved(t *testing.T) {
	s := Slots{Max: 4, PerPeer: 1, Reserved: 2}
	if !s.AcquireFor("a", false) || !s.AcquireFor("b", false) {
		t.Fatal("a stranger was refused an unreserved slot")
	}
	if s.AcquireFor("c", false) {
		t.Fatal("a stranger got a reserved slot")
	}
	if !s.AcquireFor("c", true) || !s.Acquire("d") {
		t.Fatal("a peer that counts was refused a reserved slot")
	}
	if s.AcquireFor("e", true) {
		t.Fatal("a slot beyond max")
	}
	s.Release("a")
	if s.AcquireFor("e", false) {
		t.Fatal("a stranger got a slot while the reserved ones are taken by peers that count")
	}
}

func TestSlowLinkTime(t *testing.T) {
	for _, c := range []struct {
		n    int
		want time.Duration
	}{{0, 0}, {256 << 10, time.Second}, {MaxSyncMessage, 16 * time.Second}} {
		if got := slowLinkTime(c.n); got != c.want {
			t.Errorf("slowLinkTime(%d) = %v, want %v", c.n, got, c.want)
		}
	}
}
