package node

import (
	"sync"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// connUse counts, by peer, this node's exchanges under way with it (calls,
// probes, job hand-offs, plugin fetches), and whether one of them opened
// the connection they share. The last to end closes it, if one opened it:
// the first to end used to, and every other exchange on it failed (two
// overlapping calls to one node: the second answered gone).
type connUse struct {
	mu    sync.Mutex
	peers map[peer.ID]*connUsers
}

// connUsers are the exchanges with one peer.
type connUsers struct {
	n      int
	opened bool          // one of them found no connection (or Reach made it)
	keep   int           // the least peers to keep, of those that opened it
	closed *atomic.Int64 // counts the close, if any (the first opener's)
}

// useConn registers an exchange with p about to begin. opened says it
// made the connection itself (a probe's Reach); otherwise it opens one if
// there is none. The function returned ends the exchange: the last one to
// end closes a connection one of them opened, by releaseConn's rule with
// keep, unless some other exchange runs on it (see connBusy); closed, if
// not nil, counts that. Call it after the exchange's stream is closed.
func (n *Node) useConn(p peer.ID, opened bool, keep int, closed *atomic.Int64) (done func()) {
	u := &n.connUse
	u.mu.Lock()
	e := u.peers[p]
	if e == nil {
		e = &connUsers{}
		u.peers[p] = e
	}
	e.n++
	if opened || !n.isConnected(p) {
		if !e.opened || keep < e.keep {
			e.keep = keep
		}
		if !e.opened {
			e.closed = closed
		}
		e.opened = true
	}
	u.mu.Unlock()
	return func() {
		// Under the lock: an exchange that begins meanwhile either keeps
		// the connection or finds it gone and opens its own.
		u.mu.Lock()
		defer u.mu.Unlock()
		if e.n--; e.n > 0 {
			return
		}
		delete(u.peers, p)
		// One the peer's own exchange runs on is left open, to the
		// connection manager's trim, as one the peer opened would be.
		if e.opened && !n.connBusy(p) && n.releaseConn(p, e.keep) && e.closed != nil {
			e.closed.Add(1)
		}
	}
}

// connBusy reports whether an exchange p began runs on this node's
// connections to p: a call it makes here, or a stream of a protocol that
// carries one exchange (a probe, a hand-off, a fetch, a job list or
// output, a task watch). Streams kept between exchanges (calls', probes'),
// and the connection's own upkeep (hello, sync, push, pubsub, identify),
// which starts again on the next connection, do not count.
func (n *Node) connBusy(p peer.ID) bool {
	if n.calls.InFlight(p) > 0 {
		return true
	}
	for _, c := range n.host.Network().ConnsToPeer(p) {
		for _, s := range c.GetStreams() {
			if exchangeProtocol(s.Protocol()) {
				return true
			}
		}
	}
	return false
}

// exchangeProtocol reports whether a stream of proto carries one exchange
// (see connBusy).
func exchangeProtocol(proto protocol.ID) bool {
	switch proto {
	case SwimProtocol, JobProtocol, JobOutputProtocol, JobListProtocol, PluginFetchProtocol, TaskWatchProtocol:
		return true
	}
	return false
}
