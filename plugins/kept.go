package plugins

import (
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// keptSet is the streams a Caller keeps open between calls, by callee,
// the most recently used last: at most perPeer to one callee and max in
// all, each until it has been idle for the idle time it is given.
type keptSet struct {
	max, perPeer int
	byPeer       map[peer.ID][]*callStream
	n            int
}

func newKeptSet(max, perPeer int) *keptSet {
	return &keptSet{max: max, perPeer: perPeer, byPeer: map[peer.ID][]*callStream{}}
}

// take removes and returns p's most recently used stream if it has been
// idle less than idle at now; if it has not, p's streams all have, and
// are returned to be closed.
func (k *keptSet) take(p peer.ID, now time.Time, idle time.Duration) (*callStream, []*callStream) {
	sts := k.byPeer[p]
	if len(sts) == 0 {
		return nil, nil
	}
	if cs := sts[len(sts)-1]; now.Sub(cs.used) < idle {
		k.set(p, sts[:len(sts)-1])
		k.n--
		return cs, nil
	}
	return nil, k.drop(p)
}

// put keeps cs unless its callee has perPeer kept already or the set is
// full once streams idle for idle at now are taken out (returned, to be
// closed). It reports whether cs was kept.
func (k *keptSet) put(cs *callStream, now time.Time, idle time.Duration) (bool, []*callStream) {
	var expired []*callStream
	if k.n >= k.max {
		expired = k.expire(now, idle)
	}
	if k.n >= k.max || len(k.byPeer[cs.peer]) >= k.perPeer {
		return false, expired
	}
	k.byPeer[cs.peer] = append(k.byPeer[cs.peer], cs)
	k.n++
	return true, expired
}

// expire removes and returns the streams idle for idle at now.
func (k *keptSet) expire(now time.Time, idle time.Duration) []*callStream {
	var expired []*callStream
	for p, sts := range k.byPeer {
		live := sts[:0]
		for _, s := range sts {
			if now.Sub(s.used) < idle {
				live = append(live, s)
			} else {
				expired = append(expired, s)
				k.n--
			}
		}
		k.set(p, live)
	}
	return expired
}

// drop removes and returns p's streams.
func (k *keptSet) drop(p peer.ID) []*callStream {
	sts := k.byPeer[p]
	k.n -= len(sts)
	delete(k.byPeer, p)
	return sts
}

// dropAll removes and returns every stream.
func (k *keptSet) dropAll() []*callStream {
	var all []*callStream
	for p := range k.byPeer {
		all = append(all, k.drop(p)...)
	}
	return all
}

func (k *keptSet) set(p peer.ID, sts []*callStream) {
	if len(sts) == 0 {
		delete(k.byPeer, p)
		return
	}
	k.byPeer[p] = sts
}
