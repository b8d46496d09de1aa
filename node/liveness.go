package node

import (
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/gossip/swim"
)

// Liveness: a node is left when it said so (see reap.go); otherwise what
// the failure detector (swim.go, package gossip/swim) believes: alive,
// suspect or dead. A node whose record arrived is alive until a probe
// says otherwise.

// Liveness states.
const (
	Alive   = "alive"
	Suspect = "suspect"
	Dead    = "dead"
)

// liveness tells whether p is alive, suspect, dead or left now.
func (n *Node) liveness(p peer.ID) string {
	if p == n.host.ID() {
		return Alive
	}
	return n.view(p).state()
}

// reaped reports whether p is out of this node's views (see reap.go).
func (n *Node) reaped(p peer.ID) bool {
	if p == n.host.ID() {
		return false
	}
	return n.view(p).reaped(n.now(), n.settings().reconnectTimeout)
}

// view gathers what the liveness and reaping rules need about p.
func (n *Node) view(p peer.ID) peerView {
	id := p.String() // base58: once, not for each key
	e, _ := n.replica.Get(nodesPrefix + id)
	return n.viewAt(p, id, e)
}

// viewAt is view with p as text (id) and its record entry e (nil if it
// has none) at hand.
func (n *Node) viewAt(p peer.ID, id string, e *gossip.Signed) peerView {
	var v peerView
	v.swim, v.heard, v.known = n.swimView(p)
	if !v.known && e != nil && n.swim.d != nil {
		n.swimMember(p)
	}
	if e != nil {
		v.record = e.HLC
		if c, _ := n.recordAt(e); c.rec.Left {
			v.leftAt = c.rec.LeftAt
			if v.leftAt.IsZero() {
				v.leftAt = e.HLC.Wall()
			}
		}
	}
	if e, ok := n.replica.Get(forcedPrefix + id); ok {
		v.forced = e.HLC
	}
	return v
}

// swimLiveness names a detector state.
var swimLiveness = map[swim.State]string{swim.Alive: Alive, swim.Suspect: Suspect, swim.Dead: Dead, swim.Left: Left}
