// Package slots counts the streams a server serves at once, in all and by
// peer, with some kept for the peers that count: the sync, push, job,
// fetch and call servers bound what one peer, or many identities, can
// hold of them.
package slots

import (
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Slots allows Max streams at once, PerPeer of them from one peer; the
// last Reserved of them only to peers that count (see AcquireFor). Set the
// bounds before the first Acquire.
type Slots struct {
	Max, PerPeer, Reserved int

	mu     sync.Mutex
	total  int
	byPeer map[peer.ID]int
}

// New allows max at once, perPeer of them from one peer.
func New(max, perPeer int) *Slots { return &Slots{Max: max, PerPeer: perPeer} }

// Acquire takes a slot for p, unless the bounds are reached.
func (s *Slots) Acquire(p peer.ID) bool { return s.AcquireFor(p, true) }

// AcquireFor takes a slot for p, unless the bounds are reached; a peer
// that does not count (counts false) gets none of the reserved slots.
func (s *Slots) AcquireFor(p peer.ID, counts bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	max := s.Max
	if !counts {
		max -= s.Reserved
	}
	if s.total >= max || s.byPeer[p] >= s.PerPeer {
		return false
	}
	if s.byPeer == nil {
		s.byPeer = map[peer.ID]int{}
	}
	s.total++
	s.byPeer[p]++
	return true
}

// Release gives back a slot Acquire took for p.
func (s *Slots) Release(p peer.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total--
	if s.byPeer[p]--; s.byPeer[p] <= 0 {
		delete(s.byPeer, p)
	}
}

// InUse is the number of slots taken.
func (s *Slots) InUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}
