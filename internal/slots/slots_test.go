package slots

import (
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
)

// At most Max at once and PerPeer from one peer; the Reserved last ones
// only to peers that count; a release frees the peer's and the total.
func TestSlots(t *testing.T) {
	s := &Slots{Max: 4, PerPeer: 2, Reserved: 1}
	a, b, c := peer.ID("a"), peer.ID("b"), peer.ID("c")
	for _, step := range []struct {
		p          peer.ID
		counts, ok bool
	}{
		{a, false, true}, {a, false, true}, {a, false, false}, // per peer
		{b, false, true}, {c, false, false}, // the last is reserved
		{c, true, true}, {c, true, false}, // and then all are taken
	} {
		if got := s.AcquireFor(step.p, step.counts); got != step.ok {
			t.Fatalf("%s (counts %v): %v, want %v", step.p, step.counts, got, step.ok)
		}
	}
	if s.InUse() != 4 {
		t.Fatalf("%d in use, want 4", s.InUse())
	}
	s.Release(a)
	if !s.Acquire(a) || s.Acquire(a) {
		t.Fatal("a release gave back other than one slot of a's")
	}
}
