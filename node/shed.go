package node

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// Shedding a join storm. A fleet's hosts usually share a join list of a
// few seeds, and when the fleet boots they all dial those at once; each
// joiner keeps its seed protected, so the seed's connection manager could
// only trim them after a minute's grace, and they would dial it again. So
// a node that holds ConnHigh peers sends a joiner on at once. A node short
// of peers (TargetPeers) says it is seeking in its hello; a node at
// ConnHigh says it is busy in its hello to any peer that dialled it and
// that it does not protect, and names up to maxReferrals of its peers.
// When both meet, the seeker dials the referrals instead (once the busy
// node has closed the connection, shedLinger later: their first sync can
// finish). A node told busy by its --join peer comes back to it only while
// it is short of peers, with backoff (joinDue), whether it was sent on or,
// not seeking, kept until the seed's connection manager trims it. A member
// that calls or probes a busy node is not seeking, and is not cut off. Seeds hold
// what their connection manager allows, and joiners spread over the fleet
// at once instead of waiting on the DHT.

// maxReferrals caps the peers a busy hello names.
const maxReferrals = 8

// shedLinger is how long a turned-away newcomer stays connected.
const shedLinger = 2 * time.Second

// shedState is the seeking peers being sent on.
type shedState struct {
	mu      sync.Mutex
	closing map[peer.ID]bool
	count   atomic.Int64 // seeking peers sent on: conns_shed in status
}

// seeking reports whether this node is short of peers.
func (n *Node) seeking() bool { return len(n.ConnectedPeers()) < n.cfg.TargetPeers }

// shedding reports whether this node would send p on, if p seeks: it
// holds ConnHigh peers besides p, p dialled it, and it does not protect p.
func (n *Node) shedding(p peer.ID) bool {
	others := len(n.ConnectedPeers())
	if _, ok := n.peers.get(p); ok && n.isConnected(p) {
		others-- // p's earlier hello made it a peer already
	}
	if others < n.cfg.ConnHigh || n.host.ConnManager().IsProtected(p, "") {
		return false
	}
	conns := n.host.Network().ConnsToPeer(p)
	for _, c := range conns {
		if c.Stat().Direction != network.DirInbound {
			return false
		}
	}
	return len(conns) > 0
}

// shed closes the connections to p shedLinger from now, once however many
// hellos it is told busy in.
func (n *Node) shed(p peer.ID) {
	n.sheds.mu.Lock()
	defer n.sheds.mu.Unlock()
	if n.sheds.closing == nil {
		n.sheds.closing = map[peer.ID]bool{}
	}
	if n.sheds.closing[p] {
		return
	}
	n.sheds.closing[p] = true
	n.sheds.count.Add(1)
	n.log.Debug("sending a seeking peer on: at ConnHigh", "peer", p, "peers", len(n.ConnectedPeers()))
	n.spawn(func() {
		n.sleep(shedLinger)
		n.host.Network().ClosePeer(p)
		n.sheds.mu.Lock()
		delete(n.sheds.closing, p)
		n.sheds.mu.Unlock()
	})
}

// referrals names up to maxReferrals of this node's peers other than p,
// picked at random among those that count, each by at most two of the
// addresses in its record.
func (n *Node) referrals(not peer.ID) []string {
	peers := n.ConnectedPeers()
	n.rngMu.Lock()
	n.rng.Shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
	n.rngMu.Unlock()
	rules := n.rules()
	var out []string
	for _, q := range peers {
		if len(out) >= maxReferrals {
			break
		}
		if q == not || !rules.Counts(q) {
			continue
		}
		rec, ok := n.nodeNamed(q)
		if !ok {
			continue
		}
		took := 0
		for _, a := range rec.Addrs {
			if _, err := referral(a); err == nil && took < 2 && len(out) < maxReferrals {
				out = append(out, a)
				took++
			}
		}
	}
	return out
}

// maxReferralLen caps one referral's length.
const maxReferralLen = 256

// referral parses a referral: a full /p2p/ address.
func referral(s string) (peer.AddrInfo, error) {
	if len(s) > maxReferralLen {
		return peer.AddrInfo{}, fmt.Errorf("over %d bytes", maxReferralLen)
	}
	a, err := ma.NewMultiaddr(s)
	if err != nil {
		return peer.AddrInfo{}, err
	}
	ai, err := peer.AddrInfoFromP2pAddr(a)
	if err != nil {
		return peer.AddrInfo{}, err
	}
	return *ai, nil
}

// turnedAway takes a busy hello from p. A --join peer of this node is
// marked busy (keepJoined comes back to it only while this node is short
// of peers); and if this node seeks, it dials p's referrals once p has
// closed the connection (by then their first sync brought the records that
// say which of them count). Only referrals to nodes that count are
// dialled: a busy peer cannot make this node dial whatever it names.
func (n *Node) turnedAway(p peer.ID, refs []string) {
	n.joinTurnedAway(p)
	if len(refs) == 0 || !n.seeking() {
		return
	}
	n.log.Debug("sent on by a busy peer; dialling its referrals", "peer", p, "referrals", len(refs))
	n.spawn(func() {
		if !n.sleep(shedLinger) || !n.seeking() {
			return
		}
		rules := n.rules()
		var ais []peer.AddrInfo
		for _, r := range refs {
			ai, err := referral(r)
			if err != nil || ai.ID == n.host.ID() || ai.ID == p || n.isConnected(ai.ID) || !rules.Counts(ai.ID) {
				continue
			}
			ais = append(ais, ai)
		}
		n.dialAll(ais, false)
	})
}
