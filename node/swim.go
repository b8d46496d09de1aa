package node

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/gossip/swim"
)

// Failure detection: package gossip/swim's detector, carried over libp2p
// streams of SwimProtocol (one frame each way per stream) and fed the
// nodes whose records arrive. Names in the detector are peer IDs' raw
// bytes. What a node says about itself (alive, left) or another (suspect,
// dead) is signed with its node key; a claim about another counts only
// from a node that counts (admitted or trusted, or anyone in an open
// cluster), so a stranger can neither kill nor revive anybody.

// SwimProtocol carries the failure detector's probes.
const SwimProtocol = "/tribe/swim/1.0.0"

// swimServing caps the probe streams this node serves at once; more are
// reset and counted (swim_busy): a healthy fleet sends a node about one
// probe and a few gossip messages a second.
const swimServing = 64

// swimStrangers caps the probe streams served at once to peers that do
// not count, out of swimServing: a slot is taken before the frame is
// read, for up to a probe interval, and a stranger's silent streams held
// every one (members' probes were answered busy, their gossip not
// taken). A pending node probes the members it knows, on kept streams
// mostly (swimkept.go).
const swimStrangers = 8

// swimSyncing caps the snapshots served at once (each up to
// swim.MaxSyncFrame, 2 MiB, each way).
const swimSyncing = 4

// swimSyncEvery is how often a node trades snapshots (the members that are
// not alive) with a random peer, besides once as soon as it has a peer:
// memberlist's push-pull, which makes a node that restarted agree with
// the fleet on who is dead without waiting to probe them all.
const swimSyncEvery = time.Minute

// swimDomain separates the detector's signatures from every other use of
// the node key.
const swimDomain = "tribe-swim/1\x00"

// swimState is the detector as the node wires it.
type swimState struct {
	d         *swim.Detector
	serving   chan struct{}
	refusing  chan struct{} // busy answers being written: at most swimBusyAnswers
	strangers chan struct{} // probes served to peers that do not count: at most swimStrangers
	syncing   chan struct{} // snapshots being served: at most swimSyncing
	bad       atomic.Int64  // frames that did not decode, updates that did not verify
	busy      atomic.Int64

	mu      sync.Mutex
	heard   map[peer.ID]time.Time // when each node last answered or sent a probe (the node's clock)
	reached map[peer.ID]bool      // connections Reach opened, for the probe that follows to release
	// kept holds the idle kept stream to each peer pinged on one, and
	// keptServed counts each peer's kept streams served here (swimkept.go).
	kept       map[peer.ID]*keptSwim
	keptServed map[peer.ID]int
	// keptStrangers counts the kept streams served here to peers that
	// did not count when they opened them (swimKeptStrangers).
	keptStrangers int
}

// swimConfig is the detector's configuration for the node's.
func (n *Node) swimConfig() swim.Config {
	c := swim.DefaultConfig()
	c.Self = string(n.host.ID())
	c.ProbeInterval = n.cfg.ProbeInterval
	c.ProbeTimeout = n.cfg.ProbeInterval / 2
	c.GossipInterval = max(n.cfg.ProbeInterval/5, 10*time.Millisecond)
	c.Sign = func(u swim.Update) []byte {
		sig, err := n.key.Sign(swimSigned(u))
		if err != nil {
			return nil
		}
		return sig
	}
	c.Verify = n.verifySwim
	// Gossip rides the connections this node holds: to random members it
	// would dial every member within seconds of a change, which at start
	// is every node dialling every other at once.
	c.Neighbours = func() []string {
		peers := n.host.Network().Peers()
		out := make([]string, len(peers))
		for i, p := range peers {
			out[i] = string(p)
		}
		return out
	}
	return c
}

// swimSigned is what a signature covers: every field but the signature.
func swimSigned(u swim.Update) []byte {
	b := append([]byte(swimDomain), byte(len(u.Node)))
	b = append(b, u.Node...)
	b = append(b, byte(u.State))
	b = binary.BigEndian.AppendUint64(b, u.Incarnation)
	return append(b, u.From...)
}

// verifySwim accepts an update signed by its author, a node that counts
// (admitted or trusted, or anyone in an open cluster): alive and left are
// a node's own word, about a node whose record is here (a crowd of fresh
// identities cannot join the probe rounds); suspect and dead are an
// accuser's.
func (n *Node) verifySwim(u swim.Update) bool {
	err := n.checkSwim(u)
	switch {
	case err == nil:
		return true
	case errors.Is(err, errNoRecord):
		// Not bad: the node may have started just now.
	default:
		n.swim.bad.Add(1)
		n.log.Debug("swim: claim refused", "node", peer.ID(u.Node), "state", u.State, "from", peer.ID(u.From), "err", err)
	}
	return false
}

// errNoRecord is a node's word about itself before its record is here.
var errNoRecord = errors.New("no record of the node here yet")

// checkSwim says why verifySwim refuses u.
func (n *Node) checkSwim(u swim.Update) error {
	from, err := peer.IDFromBytes([]byte(u.From))
	if err != nil {
		return fmt.Errorf("from: %w", err)
	}
	if !n.rules().Counts(from) {
		return fmt.Errorf("from %s, which does not count (%s)", from, n.rules().Status(from))
	}
	about, err := peer.IDFromBytes([]byte(u.Node))
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if limit := swimIncarnationLimit(n.now()); u.Incarnation > limit {
		// A node's incarnation is the time it started, in ms, plus one
		// per refutation (startSwim): none is this far ahead. A claim
		// that is must not be taken, least of all refuted: one at
		// swim.MaxIncarnation − 1 made its node refute at
		// MaxIncarnation, which everyone refuses, and a healthy node
		// was dead for good on one member's word.
		return fmt.Errorf("incarnation %d, past the %d any node has now", u.Incarnation, limit)
	}
	if u.State == swim.Alive || u.State == swim.Left {
		if _, ok := n.replica.Get(nodesPrefix + about.String()); !ok {
			return errNoRecord
		}
	}
	pub, err := from.ExtractPublicKey()
	if err != nil {
		return err
	}
	if ok, err := pub.Verify(swimSigned(u), u.Sig); err != nil || !ok {
		return fmt.Errorf("bad signature (%v)", err)
	}
	return nil
}

// swimIncarnationLimit is the highest incarnation a claim may carry at
// now: the time in ms, as a node starts from, with its clock as far ahead
// as an entry's may be (gossip.MaxClockSkew), which leaves a node that
// refutes now and then far below it. A node a claim pushed to the limit
// refutes one past it, which others take a millisecond later (by their
// clocks): a suspicion lasts seconds.
func swimIncarnationLimit(now time.Time) uint64 {
	return uint64(now.Add(gossip.MaxClockSkew).UnixMilli())
}

// startSwim builds the detector, serves SwimProtocol, and makes every
// node whose record is here or arrives a member.
func (n *Node) startSwim() error {
	n.rngMu.Lock()
	rng := rand.New(rand.NewPCG(n.rng.Uint64(), n.rng.Uint64()))
	n.rngMu.Unlock()
	n.swim.serving = make(chan struct{}, swimServing)
	n.swim.refusing = make(chan struct{}, swimBusyAnswers)
	n.swim.strangers = make(chan struct{}, swimStrangers)
	n.swim.syncing = make(chan struct{}, swimSyncing)
	n.swim.heard = map[peer.ID]time.Time{}
	n.swim.reached = map[peer.ID]bool{}
	n.swim.kept = map[peer.ID]*keptSwim{}
	n.swim.keptServed = map[peer.ID]int{}
	d, err := swim.New(n.swimConfig(), swimTransport{n}, rng, n.swimChanged)
	if err != nil {
		return fmt.Errorf("node: failure detector: %w", err)
	}
	n.swim.d = d
	n.host.SetStreamHandler(SwimProtocol, n.serveSwim)
	n.host.SetStreamHandler(SwimKeptProtocol, n.serveSwimKept)
	add := func(key string) {
		if id, err := peer.Decode(strings.TrimPrefix(key, nodesPrefix)); err == nil {
			n.swimMember(id)
		}
	}
	n.replica.Watch(nodesPrefix, func(c gossip.Change) { add(c.Key) })
	for _, e := range n.replica.Prefix(nodesPrefix) {
		add(e.Key)
	}
	// An incarnation above any an earlier run of this node had (they
	// start from the time they started): whoever holds it dead hears
	// it is back.
	d.Announce(uint64(n.now().UnixMilli()))
	n.spawn(func() { d.Run(n.ctx) })
	n.spawn(n.swimSyncLoop)
	return nil
}

// swimChanged takes the detector's changes: events for watchers, and the
// connections to members now dead closed (closeDead).
func (n *Node) swimChanged(changes []swim.Change) {
	n.noteLiveness(changes)
	n.closeDead(changes)
}

// closeDead closes the connections held to members the detector found
// dead, once they have stayed dead for deadCloseAfter: a host that
// vanished (power lost, network cut) leaves its connections open here,
// with nothing on them to say so, since yamux sends no keepalives (see
// muxer); the kernel's TCP keepalive would close them minutes later.
// Streams opened on them meanwhile would wait out their deadlines instead
// of failing at once on a dial. The wait spares a member taken for dead
// on an overloaded machine, which refutes within seconds: closing its
// connections would cost both ends their handshakes again, at the worst
// time.
func (n *Node) closeDead(changes []swim.Change) {
	for _, c := range changes {
		if c.State != swim.Dead {
			continue
		}
		p := peer.ID(c.Node)
		n.spawn(func() {
			if !n.sleep(deadCloseAfter) {
				return
			}
			if st, _ := n.swim.d.State(string(p)); st != swim.Dead || n.host.Network().Connectedness(p) != network.Connected {
				return // it refuted, or left; or nothing is open
			}
			n.log.Debug("closing the connections to a member found dead", "peer", p)
			n.host.Network().ClosePeer(p)
		})
	}
}

// deadCloseAfter is how long a member stays dead before closeDead closes
// its connections (a variable for tests).
var deadCloseAfter = 10 * time.Second

// swimSyncLoop trades snapshots with a random connected peer that counts:
// every two seconds until one exchange succeeds, then every swimSyncEvery.
func (n *Node) swimSyncLoop() {
	wait := 2 * time.Second
	for n.sleep(wait) {
		peers := n.ConnectedPeers()
		rules := n.rules()
		n.rngMu.Lock()
		n.rng.Shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
		n.rngMu.Unlock()
		for _, p := range peers {
			if !rules.Counts(p) {
				continue
			}
			ctx, cancel := context.WithTimeout(n.ctx, 10*time.Second)
			m, err := n.swimExchange(ctx, p, swim.Frame{Kind: swim.KindSync, Msg: swim.Message{Updates: n.swim.d.Snapshot()}})
			cancel()
			if err != nil {
				n.log.Debug("swim: snapshot exchange", "peer", p, "err", err)
				break
			}
			n.swim.d.ApplySnapshot(m.Updates)
			wait = swimSyncEvery
			break
		}
	}
}

// swimMember makes p a member of the detector if it counts (admitted or
// trusted, or anyone in an open cluster): only those are probed, so a
// stranger's record cannot make every node dial the addresses it names.
// A node admitted later becomes one when next asked about (view).
func (n *Node) swimMember(p peer.ID) {
	if p != n.host.ID() && n.rules().Counts(p) {
		n.swim.d.Add(string(p))
	}
}

// swimHeard notes that p answered a probe or sent one: it was alive then.
// Only for nodes that count: a stranger's identities, free to make, would
// each stay in heard for good.
func (n *Node) swimHeard(p peer.ID) {
	now := n.now()
	n.swim.mu.Lock()
	n.swim.heard[p] = now
	n.swim.mu.Unlock()
}

// swimView is what the detector believes of p, and when p was last heard
// from directly (zero if never, in this run).
func (n *Node) swimView(p peer.ID) (s swim.State, heard time.Time, ok bool) {
	if n.swim.d == nil {
		return 0, time.Time{}, false
	}
	s, ok = n.swim.d.State(string(p))
	n.swim.mu.Lock()
	defer n.swim.mu.Unlock()
	return s, n.swim.heard[p], ok
}

// swimTransport carries the detector's frames over SwimProtocol streams.
type swimTransport struct{ n *Node }

func (t swimTransport) Ping(ctx context.Context, node string, m swim.Message) (swim.Message, error) {
	return t.n.swimExchange(ctx, peer.ID(node), swim.Frame{Kind: swim.KindPing, Msg: m})
}

// Reach connects to node if this node is not connected to it, so that
// the probe's timeout does not pay for the dial (swim.Reacher). The
// probe that follows releases the connection as it would have released
// its own.
func (t swimTransport) Reach(ctx context.Context, node string) error {
	n, p := t.n, peer.ID(node)
	if n.isConnected(p) {
		return nil
	}
	n.learnRecordAddrs(p)
	if err := n.host.Connect(ctx, peer.AddrInfo{ID: p}); err != nil {
		return err
	}
	n.swim.mu.Lock()
	n.swim.reached[p] = true
	n.swim.mu.Unlock()
	return nil
}

// takeReached reports whether Reach opened the connection to p for the
// exchange about to run, and forgets it.
func (n *Node) takeReached(p peer.ID) bool {
	n.swim.mu.Lock()
	defer n.swim.mu.Unlock()
	ok := n.swim.reached[p]
	delete(n.swim.reached, p)
	return ok
}

func (t swimTransport) PingReq(ctx context.Context, via, target string, m swim.Message) (swim.Message, error) {
	return t.n.swimExchange(ctx, peer.ID(via), swim.Frame{Kind: swim.KindPingReq, Target: target, Msg: m})
}

// swimExchange sends one frame to p and reads the answer. A connection
// opened for it is closed after unless the node holds fewer than
// TargetPeers peers: a probe round touches every member, and keeping each
// connection it opened made every agent connected to every other (the
// connection manager trims only past ConnHigh, a minute later).
func (n *Node) swimExchange(ctx context.Context, p peer.ID, f swim.Frame) (swim.Message, error) {
	reached := n.takeReached(p)
	if f.Kind == swim.KindPing && n.swimKeptTo(p, reached) {
		if ks, ok := n.takeKept(p); ok {
			return n.swimKeptExchange(ctx, p, ks, f)
		}
	}
	// A probe of a node this one never connected to has only its
	// record's addresses (members count: see swimMember).
	n.learnRecordAddrs(p)
	defer n.useConn(p, reached, n.cfg.TargetPeers, nil)()
	s, err := n.host.NewStream(ctx, p, SwimProtocol)
	if err != nil {
		return swim.Message{}, err
	}
	defer s.Close()
	if dl, ok := ctx.Deadline(); ok {
		s.SetDeadline(dl)
	}
	if _, err := s.Write(swim.AppendFrame(nil, f)); err != nil {
		s.Reset()
		return swim.Message{}, err
	}
	s.CloseWrite()
	ans, err := readSwimFrame(s, f.Kind == swim.KindSync)
	if err != nil {
		s.Reset()
		if errors.Is(err, swim.ErrFrame) {
			n.swim.bad.Add(1)
			n.log.Debug("swim: bad answer", "peer", p, "err", err)
		}
		return swim.Message{}, err
	}
	return n.swimAnswer(p, f, ans)
}

// swimAnswer is what the answer ans from p to f says: its message, or
// that p could not reach a ping-req's target (nack) or was too busy to
// answer a ping (busy, which is alive).
func (n *Node) swimAnswer(p peer.ID, f, ans swim.Frame) (swim.Message, error) {
	n.swimHeard(p)
	switch {
	case ans.Kind == swim.KindAck && f.Kind != swim.KindSync, ans.Kind == swim.KindSync && f.Kind == swim.KindSync:
		return ans.Msg, nil
	case ans.Kind == swim.KindNack:
		return ans.Msg, swim.ErrNack // it may say the target left or died
	case ans.Kind == swim.KindBusy && f.Kind == swim.KindPing:
		return swim.Message{}, swim.ErrBusy
	}
	n.swim.bad.Add(1)
	return swim.Message{}, fmt.Errorf("%w: answered with kind %d", swim.ErrFrame, ans.Kind)
}

// errSyncRefused is a snapshot from a node that does not count, or one
// past swimSyncing at once.
var errSyncRefused = errors.New("node: snapshot not taken")

// readSwimFrame reads one frame, to the stream's end: at most
// swim.MaxFrame bytes, or swim.MaxSyncFrame for a snapshot if sync.
func readSwimFrame(s io.Reader, sync bool) (swim.Frame, error) {
	limit := int64(swim.MaxFrame)
	if sync {
		limit = swim.MaxSyncFrame
	}
	b, err := io.ReadAll(io.LimitReader(s, limit+1))
	if err != nil {
		return swim.Frame{}, err
	}
	if !sync && len(b) > 0 && swim.Kind(b[0]) == swim.KindSync {
		return swim.Frame{}, errSyncRefused
	}
	return swim.DecodeFrame(b)
}

// answerBusy answers a ping this node has no room to serve with
// KindBusy (alive, nothing taken), at most swimBusyAnswers at once; of
// the frame it decodes only the kind. Anything else it resets: a ping-req it
// cannot carry out (the requester asks others), a snapshot it will trade
// later. A stream past the bound is reset too.
func (n *Node) answerBusy(s network.Stream) {
	select {
	case n.swim.refusing <- struct{}{}:
		defer func() { <-n.swim.refusing }()
	default:
		s.Reset()
		return
	}
	s.SetDeadline(n.now().Add(swimBusyWait))
	var kind [1]byte
	if _, err := io.ReadFull(s, kind[:]); err != nil || swim.Kind(kind[0]) != swim.KindPing {
		s.Reset()
		return
	}
	if _, err := s.Write(swim.AppendFrame(nil, swim.Frame{Kind: swim.KindBusy})); err != nil {
		s.Reset()
		return
	}
	// The answer first, then the rest of the frame, unread: closing the
	// reading side under bytes still coming resets some transports'
	// streams (QUIC's STOP_SENDING), and with them the answer.
	s.CloseWrite()
	io.Copy(io.Discard, io.LimitReader(s, swim.MaxFrame))
	s.Close()
}

// swimBusyAnswers bounds the busy answers in flight, and swimBusyWait the
// wait for a frame's first byte in one.
const (
	swimBusyAnswers = 4 * swimServing
	swimBusyWait    = time.Second
)

// serveSwim answers a probe, a gossip message or a ping-req.
func (n *Node) serveSwim(s network.Stream) {
	remote := s.Conn().RemotePeer()
	counts := n.rules().Counts(remote)
	if !counts {
		select {
		case n.swim.strangers <- struct{}{}:
			defer func() { <-n.swim.strangers }()
		default:
			n.swim.busy.Add(1)
			s.Reset()
			return
		}
	}
	select {
	case n.swim.serving <- struct{}{}:
		defer func() { <-n.swim.serving }()
	default:
		n.swim.busy.Add(1)
		n.answerBusy(s)
		return
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.ProbeInterval)
	defer cancel()
	dl, _ := ctx.Deadline()
	s.SetDeadline(dl)
	// Snapshots (up to swim.MaxSyncFrame) only from nodes that count, a
	// few at a time; from anyone else a frame is a probe's size.
	sync := counts
	if sync {
		select {
		case n.swim.syncing <- struct{}{}:
			defer func() { <-n.swim.syncing }()
		default:
			sync = false
		}
	}
	f, err := readSwimFrame(s, sync)
	if err == nil && f.Kind != swim.KindPing && f.Kind != swim.KindPingReq && f.Kind != swim.KindSync {
		err = fmt.Errorf("%w: kind %d asks nothing", swim.ErrFrame, f.Kind)
	}
	if errors.Is(err, errSyncRefused) {
		n.swim.busy.Add(1)
		s.Reset()
		return
	}
	if err != nil {
		if errors.Is(err, swim.ErrFrame) { // not a reset or a deadline
			n.swim.bad.Add(1)
			n.log.Debug("swim: bad frame", "peer", remote, "err", err)
		}
		s.Reset()
		return
	}
	if counts {
		n.swimHeard(remote)
	}
	if f.Kind == swim.KindSync {
		// What it holds stale first, then what this node holds not alive.
		fix := n.swim.d.Corrections(f.Msg.Updates)
		n.swim.d.ApplySnapshot(f.Msg.Updates)
		answer := append(fix, n.swim.d.Snapshot()...)
		answer = answer[:min(len(answer), swim.MaxSnapshot)]
		if _, err := s.Write(swim.AppendFrame(nil, swim.Frame{Kind: swim.KindSync, Msg: swim.Message{Updates: answer}})); err != nil {
			s.Reset()
		}
		return
	}
	ans := swim.Frame{Kind: swim.KindAck}
	switch {
	case f.Kind == swim.KindPing && counts:
		ans.Msg = n.swim.d.HandlePing(string(remote), f.Msg)
	case f.Kind == swim.KindPing:
		// A plain ack: this node's gossip is for its members. Handed to
		// whoever pings, a stranger's few pings spent every update's
		// sends (a refutation went to the stranger only).
		n.swim.d.Receive(f.Msg)
	default:
		// Only members are probed for others, and only for nodes that
		// count (helpers are picked among members): a ping-req is no
		// way to make this node dial whatever a stranger names, nor to
		// make it probe for a stranger.
		if _, known := n.swim.d.State(f.Target); !counts || !known || f.Target == string(n.host.ID()) {
			ans.Kind = swim.KindNack
			break
		}
		m, err := n.swim.d.HandlePingReq(ctx, string(remote), f.Target, f.Msg)
		if err != nil {
			ans.Kind = swim.KindNack
		}
		ans.Msg = m
	}
	if _, err := s.Write(swim.AppendFrame(nil, ans)); err != nil {
		s.Reset()
	}
}
