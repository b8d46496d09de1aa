package node

import (
	"github.com/libp2p/go-libp2p/core/peer"

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
	var v peerView
	v.swim, v.heard, v.known = n.swimView(p)
	id := p.String() // base58: once, not for each key
	e, ok := n.replica.Get(nodesPrefix + id)
	if !v.known && ok && n.swim.d != nil {
		n.swimMember(p)
	}
	if ok {
		v.record = e.HLC
		if rec := n.nameIn(p, e); rec.Left {
			v.leftAt = rec.LeftAt
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
