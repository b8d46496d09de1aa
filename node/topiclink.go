package node

import (
	"maps"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Topic links: a connected peer of the cluster that pubsub does not list
// in the state topic gets nothing this node publishes, and this node
// nothing it does. Pubsub opens its stream to a peer when identify says
// the peer speaks pubsub; if that fails (handleNewPeer sends the peer to
// newPeerError, which deletes it), or the stream dies five times within
// ten minutes (handleDeadPeers, MaxBackoffAttempts), it gives the peer up
// until a new connection's identify (go-libp2p-pubsub v0.17.0): a peer at
// its stream limits in a join storm stays connected and deaf. Such a peer
// is relinked: all its connections closed, and dialled again a moment
// later (relink).

// topicLinkGrace, in probe intervals, is how long a connected peer of
// the cluster may be missing from the state topic before it is relinked:
// long enough for pubsub to open its streams on a new connection under
// load.
const topicLinkGrace = 10

// staleTopicLinks is the peers of connected that have been missing from
// inTopic for at least grace, as of now; missing holds since when each
// missing peer has been (it is updated: peers back in the topic, or no
// longer connected, are dropped, and those returned start over).
func staleTopicLinks(connected []peer.ID, inTopic map[peer.ID]bool, missing map[peer.ID]time.Time, now time.Time, grace time.Duration) []peer.ID {
	seen := make(map[peer.ID]bool, len(connected))
	var stale []peer.ID
	for _, p := range connected {
		seen[p] = true
		if inTopic[p] {
			delete(missing, p)
			continue
		}
		since, ok := missing[p]
		switch {
		case !ok:
			missing[p] = now
		case now.Sub(since) >= grace:
			stale = append(stale, p)
			delete(missing, p)
		}
	}
	for p := range missing {
		if !seen[p] {
			delete(missing, p)
		}
	}
	return stale
}

// topicLinkLoop relinks the connected peers of the cluster that count
// (admitted or trusted, or anyone in an open cluster) and stay missing
// from the state topic (staleTopicLinks), checking every half grace (a
// check a second woke every idle agent for what happens in a join storm).
// A peer is relinked at most once in topicLinkRetry graces: a peer that
// never joins the topic (it cannot be made to) is dialled again that
// often, not every grace, at addresses it named itself.
func (n *Node) topicLinkLoop() {
	grace := topicLinkGrace * n.cfg.ProbeInterval
	every := grace / 2
	missing := map[peer.ID]time.Time{}
	relinked := map[peer.ID]time.Time{}
	for n.sleep(every) {
		now := n.now()
		inTopic := map[peer.ID]bool{}
		for _, p := range n.replica.TopicPeers() {
			inTopic[p] = true
		}
		rules := n.rules()
		connected := slices.DeleteFunc(n.ConnectedPeers(), func(p peer.ID) bool {
			return !rules.Counts(p) || now.Sub(relinked[p]) < topicLinkRetry*grace
		})
		for _, p := range staleTopicLinks(connected, inTopic, missing, now, grace) {
			n.log.Info("peer connected but missing from the state topic: reconnecting", "peer", p)
			relinked[p] = now
			n.relinkSoon(p)
		}
		maps.DeleteFunc(relinked, func(_ peer.ID, at time.Time) bool { return now.Sub(at) >= topicLinkRetry*grace })
	}
}

// topicLinkRetry, in graces, is how long after a relink a peer still
// missing from the topic waits for the next.
const topicLinkRetry = 10
