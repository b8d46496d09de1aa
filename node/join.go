package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"

	"github.com/tribeagent/tribe/internal/backoff"
	"github.com/tribeagent/tribe/node/api"
)

func (n *Node) backoff(failures int) time.Duration {
	return backoff.Wait(failures, n.cfg.BackoffMin, n.cfg.BackoffMax, n.float())
}

// join is one --join address and how it fares, for `tribe status`: an
// operator whose seed is of another cluster, or unreachable, sees why
// nothing happens.
type join struct {
	target joinTarget

	mu     sync.Mutex
	st     api.Join
	sheds  int       // busy answers since it last took this node in
	shedAt time.Time // the last of them
	joined bool      // it took this node in once: its part is done
	connAt time.Time // when it last became connected, not yet heard
	silent int       // redials for want of a hello since it was last heard
}

func newJoin(t joinTarget) *join {
	j := &join{target: t, st: api.Join{Addr: t.given, State: api.JoinConnecting}}
	if t.id != "" {
		j.st.ID = t.id.String()
	}
	return j
}

func (j *join) status() api.Join {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.st
}

// peer is the ID dialled last (given, or learnt), empty before.
func (j *join) peer() peer.ID {
	j.mu.Lock()
	defer j.mu.Unlock()
	id, _ := peer.Decode(j.st.ID)
	return id
}

// set moves j to state and reports whether that is a change, so each
// change is logged once.
func (j *join) set(id peer.ID, state, cluster, errText string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	old := j.st
	if id != "" {
		j.st.ID = id.String()
	}
	j.st.State, j.st.Cluster, j.st.Error = state, cluster, errText
	if state == api.JoinJoined {
		j.sheds, j.silent, j.joined = 0, 0, true
	}
	return old.State != state || old.ID != j.st.ID || old.Cluster != cluster
}

// turnedAway records a busy answer from the join peer at now, and
// reports whether the peer was not busy before.
func (j *join) turnedAway(now time.Time) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.sheds++
	j.shedAt = now
	was := j.st.State
	j.st.State, j.st.Error = api.JoinBusy, "it holds as many peers as it keeps; this node joins through the others"
	return was != api.JoinBusy
}

// rest marks a join peer that took this node in, and is not connected
// nor to be dialled now, done (unless it said busy, which stands), and
// reports whether that is a change.
func (j *join) rest() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if !j.joined || j.st.State == api.JoinBusy || j.st.State == api.JoinDone {
		return false
	}
	j.st.State, j.st.Error = api.JoinDone, ""
	return true
}

// shed is how many busy answers the join peer gave since it last took
// this node in, when the last came, and whether it ever took it in.
func (j *join) shed() (sheds int, at time.Time, joined bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.sheds, j.shedAt, j.joined
}

// connected records a new connection to id, unless its hello has been
// heard already (it may come first).
func (j *join) connected(id peer.ID, now time.Time) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.st.ID == id.String() && (j.st.State == api.JoinJoined || j.st.State == api.JoinOtherCluster) {
		return
	}
	if j.st.State != api.JoinConnected || j.st.ID != id.String() {
		j.connAt = now
	}
	j.st.ID, j.st.State, j.st.Cluster, j.st.Error = id.String(), api.JoinConnected, "", ""
}

// unheard is how long j's peer has been connected without a hello from
// it, at now; ok is false unless it is in that state.
func (j *join) unheard(now time.Time) (d time.Duration, ok bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.st.State != api.JoinConnected || j.connAt.IsZero() {
		return 0, false
	}
	return now.Sub(j.connAt), true
}

// redialSilent moves j back to connecting for want of a hello after d,
// and reports whether it is the first such redial since the peer was last
// heard (the one worth an info line; the rest are counted).
func (j *join) redialSilent(d time.Duration) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.silent++
	j.st.State, j.st.Error = api.JoinConnecting, fmt.Sprintf("connected, but no hello in %v; dialling again", d.Round(time.Second))
	return j.silent == 1
}

// joinUnheard is how long a join peer may stay connected without a hello
// before the node closes the connection and dials it again: twice the
// hello's own timeout. Seen with 100 agents joining one seed on two cores:
// a joiner whose connection never got past identify (no hello, no error)
// stayed alone for as long as it ran, since the peer was "connected".
const joinUnheard = 2 * helloTimeout

// keepJoined dials a --join peer, and dials it again with backoff whenever
// it is not connected and joinDue says so: until it has taken this node
// in, and after that whenever this node is short of peers, for the node's
// whole life.
func (n *Node) keepJoined(j *join) {
	if id := j.target.id; id != "" {
		n.host.ConnManager().Protect(id, "tribe-join")
		n.host.Peerstore().AddAddrs(id, j.target.addrInfo(id).Addrs, peerstore.PermanentAddrTTL)
	}
	// While connected, look again this often; a lost seed is re-dialled
	// within about this time.
	recheck := 10 * n.cfg.BackoffMin
	failures := 0
	for {
		wait := recheck
		if id := j.peer(); id != "" && n.isConnected(id) {
			// Connected again by other means (its dial, a probe): what
			// it said last time stands.
			if h, ok := n.peers.get(id); ok && j.status().State == api.JoinDone {
				n.joinHeard(id, h)
			}
			if d, ok := j.unheard(n.now()); ok && d >= joinUnheard {
				level := slog.LevelDebug
				if j.redialSilent(d) {
					level = slog.LevelInfo
				}
				n.log.Log(n.ctx, level, "join peer connected but said no hello; dialling it again", "addr", j.target.given, "peer", id, "after", d)
				n.joinRedials.Add(1)
				n.host.Network().ClosePeer(id)
			}
		}
		switch id := j.peer(); {
		case id != "" && n.host.Network().Connectedness(id) == network.Connected:
		case !n.joinDue(j):
			if j.rest() {
				n.log.Debug("join peer not connected; its part is done: dialled again only while short of peers", "addr", j.target.given)
			}
		default:
			id, err := n.dialJoin(j)
			switch {
			case errors.Is(err, errJoinSelf):
				j.set(n.host.ID(), api.JoinSelf, "", "")
				n.log.Warn("ignoring --join address of this node itself", "addr", j.target.given)
				return
			case err != nil && id != "" && n.isConnected(id):
				// The dial gave up but its connection stands (identify
				// not done by the deadline, on a seed busy with a join
				// storm): wait for its hello as on any connection, and
				// dial again if none comes (joinUnheard). Marked
				// unreachable, it was never dialled again, connected, and
				// the agent stayed alone (seen: 3 of 200 agents, 4
				// minutes).
				failures++
				j.connected(id, n.now())
				n.log.Debug("join peer connected, its dial gave up", "addr", j.target.given, "err", err)
				wait = n.backoff(failures)
			case err != nil:
				failures++
				j.set(id, api.JoinUnreachable, "", err.Error())
				if failures == 1 {
					n.log.Warn("join peer unreachable; retrying with backoff", "addr", j.target.given, "err", err)
				} else {
					n.log.Debug("join peer still unreachable", "addr", j.target.given, "failures", failures, "err", err)
				}
				wait = n.backoff(failures)
			default:
				failures = 0
				j.connected(id, n.now())
				// A reconnected peer is not greeted again: what it said
				// last time stands.
				if h, ok := n.peers.get(id); ok {
					n.joinHeard(id, h)
				}
			}
		}
		if !n.sleep(wait) {
			return
		}
	}
}

var errJoinSelf = errors.New("node: the join address is this node's own")

// joinDue reports whether a join peer that is not connected should be
// dialled now (joinDueAt).
func (n *Node) joinDue(j *join) bool {
	sheds, at, joined := j.shed()
	short := len(n.ConnectedPeers()) < n.cfg.TargetPeers && n.shortARound()
	return joinDueAt(sheds, at, joined, short, n.now(), n.cfg.BackoffMin, n.cfg.BackoffMax)
}

// joinDueAt decides whether to dial a join peer that is not connected, at
// now. Until it has taken this node in, and has not turned it away, it is
// dialled (on the join's own backoff). Once it has done either, its part
// is done: it is dialled again only while this node is short of peers,
// and has been for a discovery round (the records and remembered peers
// did not make up for the loss: a node that holds about TargetPeers is
// short after any trim); after busy answers, only once a backoff that
// grows with each has passed. A seed that holds more than ConnHigh peers
// trims the oldest, the fleet's first joiners among them: were they to
// dial it again at once, it would take them back, go over ConnHigh again
// and trim again, a minute later (the connection manager's grace), for as
// long as the fleet is larger than ConnHigh. Seen with 140 agents joining
// one seed on two cores: the seed's handshakes were taken by that cycle,
// and the last joiners' handshakes timed out.
func joinDueAt(sheds int, shedAt time.Time, joined, short bool, now time.Time, lo, hi time.Duration) bool {
	switch {
	case sheds == 0 && !joined:
		return true
	case !short:
		return false
	case sheds == 0:
		return true
	}
	return now.Sub(shedAt) >= backoff.Wait(sheds, lo, hi, 0.5)
}

// joinTurnedAway marks the --join entries of p busy.
func (n *Node) joinTurnedAway(p peer.ID) {
	for _, j := range n.joins {
		if j.peer() == p && j.turnedAway(n.now()) {
			n.log.Info("join peer is busy: joining through the peers it named, and back to it only when short of peers", "addr", j.target.given, "peer", p)
		}
	}
}

// joinDialTimeout bounds a dial of a join peer (a variable for tests).
var joinDialTimeout = dialTimeout

// dialJoin connects to j's peer, learning its ID first when the address
// does not name it. An address without an ID is asked again on every dial:
// the host there may have been reinstalled with a new identity.
func (n *Node) dialJoin(j *join) (peer.ID, error) {
	ctx, cancel := context.WithTimeout(n.ctx, joinDialTimeout)
	defer cancel()
	id := j.target.id
	if id == "" {
		var err error
		if id, err = learnPeerID(ctx, j.target.addr, n.key, n.psk); err != nil {
			return "", fmt.Errorf("learning the peer ID: %w", err)
		}
		if old := j.peer(); old != "" && old != id {
			// Reinstalled with a new identity: the old one is no seed.
			n.host.ConnManager().Unprotect(old, "tribe-join")
			n.host.Peerstore().ClearAddrs(old) // added with a permanent TTL, never to expire
		}
		if id != n.host.ID() {
			n.host.ConnManager().Protect(id, "tribe-join")
			n.host.Peerstore().AddAddrs(id, j.target.addrInfo(id).Addrs, peerstore.PermanentAddrTTL)
		}
	}
	if id == n.host.ID() {
		return id, errJoinSelf
	}
	// keepJoined's own backoff (BackoffMax at most) decides when a join
	// peer is dialled again; the swarm's would add its own, growing to 5
	// minutes, and answer most of those dials "dial backoff" without
	// trying. Seen with 200 agents joining one seed on two cores: joiners
	// whose first handshakes timed out stayed alone for 20 minutes while
	// the seed was up.
	return id, n.host.Connect(network.WithForceDirectDial(ctx, "a join peer, on the join's own backoff"), j.target.addrInfo(id))
}

// joinHeard updates the --join entries of p with its hello: a peer of
// another cluster is connected but never becomes a peer of this one, which
// an operator must be told rather than see "joined" and then nothing.
func (n *Node) joinHeard(p peer.ID, h hello) {
	for _, j := range n.joins {
		if j.peer() != p {
			continue
		}
		if h.Cluster != n.cfg.Cluster {
			if j.set(p, api.JoinOtherCluster, h.Cluster, "") {
				n.log.Warn("join peer belongs to another cluster: connected, but not a peer of this one; check --cluster on both hosts",
					"addr", j.target.given, "peer", p, "its_cluster", h.Cluster, "our_cluster", n.cfg.Cluster)
			}
			continue
		}
		if j.set(p, api.JoinJoined, h.Cluster, "") {
			n.log.Info("joined", "addr", j.target.given, "peer", p, "name", h.Name)
		}
	}
}

// joinStatus lists how each --join address fares.
func (n *Node) joinStatus() []api.Join {
	var out []api.Join
	for _, j := range n.joins {
		out = append(out, j.status())
	}
	return out
}

// bootstrapPeers are the --join peers named by ID, for the DHT; the others
// reach its routing table once connected.
func (n *Node) bootstrapPeers() []peer.AddrInfo {
	var out []peer.AddrInfo
	for _, j := range n.joins {
		if id := j.target.id; id != "" && id != n.host.ID() {
			out = append(out, j.target.addrInfo(id))
		}
	}
	return out
}

// connect dials ai with the node's dial timeout.
func (n *Node) connect(ai peer.AddrInfo) error {
	ctx, cancel := context.WithTimeout(n.ctx, dialTimeout)
	defer cancel()
	return n.host.Connect(ctx, ai)
}
