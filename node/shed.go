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

// maxFollowing caps the busy answers whose referrals are being dialled
// at once, each up to maxParallelDials dials.
const maxFollowing = 2

// shedState is the seeking peers being sent on, and the busy answers this
// node follows.
type shedState struct {
	mu      sync.Mutex
	closing map[peer.ID]bool
	count   atomic.Int64 // seeking peers sent on: conns_shed in status

	followMu  sync.Mutex
	followed  map[peer.ID]time.Time // busy answers followed, within the interval
	following int                   // of them, those whose referrals are being dialled

	notDialled atomic.Int64 // busy hellos on a connection the peer opened: busy_not_dialled
	skipped    atomic.Int64 // busy answers not followed, too many being: referrals_skipped
	follows    atomic.Int64 // busy answers followed (tests)
}

// follow reports whether a busy answer from p is followed now: one per
// peer per interval (a busy peer answers each hello of a connection busy)
// and at most maxFollowing at once. A true takes a slot that unfollow
// gives back.
func (s *shedState) follow(p peer.ID, now time.Time, interval time.Duration) bool {
	s.followMu.Lock()
	defer s.followMu.Unlock()
	for q, at := range s.followed {
		if now.Sub(at) >= interval {
			delete(s.followed, q)
		}
	}
	if _, again := s.followed[p]; again {
		return false
	}
	if s.following >= maxFollowing {
		s.skipped.Add(1)
		return false
	}
	if s.followed == nil {
		s.followed = map[peer.ID]time.Time{}
	}
	s.followed[p] = now
	s.following++
	s.follows.Add(1)
	return true
}

func (s *shedState) unfollow() {
	s.followMu.Lock()
	defer s.followMu.Unlock()
	s.following--
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

// turnedAway takes a busy hello from p, a peer this node dialled (heard
// drops busy from any other: it would make this node dial whatever it
// names). A --join peer of this node is marked busy (keepJoined comes back
// to it only while this node is short of peers); and if this node seeks,
// it dials p's referrals once p has closed the connection (by then their
// first sync brought the records that say which of them count), one busy
// answer per peer per discovery interval.
func (n *Node) turnedAway(p peer.ID, refs []string) {
	n.joinTurnedAway(p)
	if len(refs) == 0 || !n.seeking() || !n.sheds.follow(p, n.now(), n.cfg.DiscoveryInterval) {
		return
	}
	n.log.Debug("sent on by a busy peer; dialling its referrals", "peer", p, "referrals", len(refs))
	n.spawn(func() {
		defer n.sheds.unfollow()
		if !n.sleep(shedLinger) || !n.seeking() {
			return
		}
		n.dialAll(n.referred(p, refs), false)
	})
}

// referred turns p's referrals into the nodes to dial: only nodes that
// count (a busy peer cannot make this node dial whatever it names), one
// entry per node, and by the addresses of its record when this node holds
// one rather than those p named.
func (n *Node) referred(p peer.ID, refs []string) []peer.AddrInfo {
	rules := n.rules()
	var ais []peer.AddrInfo
	at := map[peer.ID]int{} // index in ais
	fromRecord := map[peer.ID]bool{}
	for _, r := range refs {
		ai, err := referral(r)
		if err != nil || ai.ID == n.host.ID() || ai.ID == p || n.isConnected(ai.ID) || !rules.Counts(ai.ID) {
			continue
		}
		if i, ok := at[ai.ID]; ok {
			if !fromRecord[ai.ID] {
				ais[i].Addrs = append(ais[i].Addrs, ai.Addrs...)
			}
			continue
		}
		if rec, ok := n.nodeNamed(ai.ID); ok {
			if as := recordAddrs(ai.ID, rec.Addrs[:min(len(rec.Addrs), maxRecordAddrs)]); len(as) > 0 {
				ai.Addrs, fromRecord[ai.ID] = as, true
			}
		}
		at[ai.ID] = len(ais)
		ais = append(ais, ai)
	}
	return ais
}
