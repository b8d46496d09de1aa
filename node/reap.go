package node

import (
	"time"

	"github.com/tribeagent/tribe/gossip"
)

// Leaving and reaping. A node that stops cleanly says so in its own
// record ({"left": true, "left_at": ...}) and is `left`, not suspect then
// dead, until it writes a newer record or sends presence after it left.
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
	connected bool
	heard     time.Time  // this node's clock: when its latest presence arrived
	sent      time.Time  // its clock: when it sent its latest presence
	record    gossip.HLC // its record's clock; zero if it has none
	leftAt    time.Time  // its record says it left then; zero if not
	forced    gossip.HLC // a force-leave entry's clock; zero if none
}

// forcedOut reports whether a force-leave is newer than the node's record.
func (v peerView) forcedOut() bool { return v.forced != 0 && v.forced > v.record }

// state is the node's liveness: left (said so, or forced out, whatever
// connections linger), else alive, suspect or dead by presence.
func (v peerView) state(now time.Time, timeout time.Duration) string {
	if v.forcedOut() || (!v.leftAt.IsZero() && !v.sent.After(v.leftAt)) {
		return Left
	}
	return liveness(v.connected, v.heard, now, timeout)
}

// reaped reports whether the node is out of this node's views: forced
// out, or dead or left and not heard from (presence, or its record's
// clock) for longer than reconnect.
func (v peerView) reaped(now time.Time, timeout, reconnect time.Duration) bool {
	if v.forcedOut() {
		return true
	}
	switch v.state(now, timeout) {
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
