package node

import (
	"time"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/gossip/swim"
)

// Leaving and reaping. A node that stops cleanly says so in its own
// record ({"left": true, "left_at": ...}) and is `left`, not suspect then
// dead, until it writes a newer record.
// A trusted writer may force a node out (forced/<peer>, `tribe
// force-leave`): it is left until it writes a record newer than that
// entry. Reaping is each node's own decision, since only a node may write
// its record: a node dead or left for longer than ReconnectTimeout, or
// force-left, is hidden from the views (nodes, members, name resolution)
// until it is heard from again; its record stays in the state.

// Left is the liveness of a node that left (or was forced out).
const Left = "left"

// peerView is what this node knows of another for the rules below.
type peerView struct {
	swim   swim.State // what the failure detector believes
	known  bool       // whether it knows the node at all
	heard  time.Time  // this node's clock: when it last answered or sent a probe
	record gossip.HLC // its record's clock; zero if it has none
	leftAt time.Time  // its record says it left then; zero if not
	forced gossip.HLC // a force-leave entry's clock; zero if none
}

// forcedOut reports whether a force-leave is newer than the node's record.
func (v peerView) forcedOut() bool { return v.forced != 0 && v.forced > v.record }

// state is the node's liveness: left (its record says so, or it was
// forced out, whatever the detector believes: a node that comes back
// writes a record without left), else the detector's word; a node the
// detector does not know yet is alive (its record just arrived).
func (v peerView) state() string {
	switch {
	case v.forcedOut() || !v.leftAt.IsZero():
		return Left
	case !v.known:
		return Alive
	}
	return swimLiveness[v.swim]
}

// reaped reports whether the node is out of this node's views: forced
// out, or dead or left and not heard from for longer than reconnect (a
// probe, its record's clock, or the time it left, whichever is latest).
func (v peerView) reaped(now time.Time, reconnect time.Duration) bool {
	if v.forcedOut() {
		return true
	}
	switch v.state() {
	case Dead, Left:
	default:
		return false
	}
	last := v.heard
	if w := v.record.Wall(); v.record != 0 && w.After(last) {
		last = w
	}
	if v.leftAt.After(last) {
		last = v.leftAt
	}
	return now.Sub(last) > reconnect
}
