package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/internal/strictjson"
)

// HelloProtocol tells two connected peers each other's name and cluster.
// The dialler of the stream sends its hello, the other side answers with its
// own, and both remember what they heard. Identify carries no such names, and
// listing peers by name is the first thing an operator asks for.
const HelloProtocol protocol.ID = "/tribe/hello/1.0.0"

const (
	maxHelloSize = 4 << 10
	helloTimeout = 10 * time.Second
	// badHelloWarnEvery is how often a peer's bad hellos may be warned of;
	// the bad_hello counter counts them all.
	badHelloWarnEvery = time.Minute
)

// Hellos served at once (helloing): at most helloPerPeer of one peer (a
// peer greets once per connection), and helloServing in all, the last
// helloReserved of them for peers that count. Each waits up to
// helloTimeout for its message: unbounded, a stranger's silent streams
// held every inbound stream libp2p allows, probes and calls included.
const (
	helloServing  = 256
	helloPerPeer  = 2
	helloReserved = 192
)

// ErrBadHello is returned for a hello message that is not valid.
var ErrBadHello = errors.New("node: bad hello message")

// hello is the one message of HelloProtocol.
type hello struct {
	Name    string `json:"name"`
	Cluster string `json:"cluster"`
	Version string `json:"version"`
	// Boot is random per start of the agent: a new one from a peer we
	// still hold connections to means those belong to its previous run
	// (see relink).
	Boot string `json:"boot,omitempty"`
	// Seeking says the sender has fewer peers than it looks for
	// (TargetPeers): it is joining, and a busy peer may send it on.
	Seeking bool `json:"seeking,omitempty"`
	// Busy says the sender holds as many peers as it keeps (ConnHigh)
	// and sends a seeking peer on: it closes the connection in a moment,
	// and the peer dials the referrals instead (see shed.go).
	Busy bool `json:"busy,omitempty"`
}

// helloMsg is the one message of HelloProtocol on the wire: a hello, and
// with Busy, where to go instead.
type helloMsg struct {
	hello
	// Referrals are full /p2p/ addresses of some of a busy sender's
	// peers: at most maxReferrals.
	Referrals []string `json:"referrals,omitempty"`
}

// decodeHello parses a hello from the network: at most maxHelloSize bytes
// of JSON with a valid cluster name, and referrals only with busy, each a
// full /p2p/ address.
func decodeHello(b []byte) (helloMsg, error) {
	if len(b) > maxHelloSize {
		return helloMsg{}, fmt.Errorf("%w: %d bytes, limit %d", ErrBadHello, len(b), maxHelloSize)
	}
	var h helloMsg
	if err := strictjson.Decode(b, &h); err != nil {
		return helloMsg{}, fmt.Errorf("%w: %v", ErrBadHello, err)
	}
	if !clusterRE().MatchString(h.Cluster) {
		return helloMsg{}, fmt.Errorf("%w: cluster %q", ErrBadHello, h.Cluster)
	}
	if len(h.Name) > maxNameLen || len(h.Version) > maxVersionLen || len(h.Boot) > 64 {
		return helloMsg{}, fmt.Errorf("%w: name, version or boot too long", ErrBadHello)
	}
	if !names.Printable(h.Name) || !names.Printable(h.Version) || !names.Printable(h.Boot) {
		// As a record's (checkRecord): shown in tribe peers.
		return helloMsg{}, fmt.Errorf("%w: name, version or boot not printable text", ErrBadHello)
	}
	if len(h.Referrals) > 0 && !h.Busy {
		return helloMsg{}, fmt.Errorf("%w: referrals from a peer that is not busy", ErrBadHello)
	}
	if len(h.Referrals) > maxReferrals {
		return helloMsg{}, fmt.Errorf("%w: %d referrals, limit %d", ErrBadHello, len(h.Referrals), maxReferrals)
	}
	for _, r := range h.Referrals {
		if _, err := referral(r); err != nil {
			return helloMsg{}, fmt.Errorf("%w: referral %q: %v", ErrBadHello, r, err)
		}
	}
	if h.Referrals != nil && len(h.Referrals) == 0 {
		h.Referrals = nil // [] and absent are the same answer
	}
	return h, nil
}

// peerBook holds what hello told us, by peer.
type peerBook struct {
	mu sync.RWMutex
	m  map[peer.ID]hello
}

func newPeerBook() *peerBook { return &peerBook{m: map[peer.ID]hello{}} }

func (b *peerBook) get(p peer.ID) (hello, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	h, ok := b.m[p]
	return h, ok
}

// put records h and returns what it replaced, if anything.
func (b *peerBook) put(p peer.ID, h hello) (old hello, had bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	old, had = b.m[p]
	b.m[p] = h
	return old, had
}

// forget drops what p's hello said.
func (b *peerBook) forget(p peer.ID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, p)
}

// size is how many peers the book holds.
func (b *peerBook) size() int {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return len(b.m)
}

func (n *Node) ownHello() hello {
	return hello{Name: n.cfg.Name, Cluster: n.cfg.Cluster, Version: Version, Boot: n.boot}
}

// helloTo is the hello for p: this node's own, seeking while it is short
// of peers, and busy with referrals while it would send p on if p seeks
// (see shed.go).
func (n *Node) helloTo(p peer.ID) helloMsg {
	m := helloMsg{hello: n.ownHello()}
	m.Seeking = n.seeking()
	if n.shedding(p) {
		m.Busy, m.Referrals = true, n.referrals(p)
	}
	return m
}

// startHello serves HelloProtocol and greets every new peer once identify
// has told us it speaks it.
func (n *Node) startHello() error {
	n.host.SetStreamHandler(HelloProtocol, n.handleHello)
	// A peer that does not count is forgotten once gone: identities cost
	// nothing to make, and each one that said hello stayed in the book
	// for good. The hellos of nodes that count stay, so that one that
	// comes back restarted is told apart (restarted).
	err := n.onEvent(new(event.EvtPeerConnectednessChanged), func(e any) {
		ev := e.(event.EvtPeerConnectednessChanged)
		if ev.Connectedness != network.Connected && !n.rules().Counts(ev.Peer) {
			n.peers.forget(ev.Peer)
		}
	})
	if err != nil {
		return err
	}
	return n.onEvent(new(event.EvtPeerIdentificationCompleted), func(e any) {
		ev := e.(event.EvtPeerIdentificationCompleted)
		if !slices.Contains(ev.Protocols, HelloProtocol) {
			return
		}
		// A peer heard before is greeted again only to say this node is
		// busy: one it kept at first, trimmed and now back, must hear it
		// is not to come back (see shed.go).
		if _, known := n.peers.get(ev.Peer); known && !n.shedding(ev.Peer) {
			return
		}
		n.spawn(func() { n.greet(ev.Peer) })
	})
}

// onEvent calls f, on one goroutine, with every event of typ's type the
// host's event bus delivers, until the node closes. f must not block.
func (n *Node) onEvent(typ any, f func(any)) error {
	sub, err := n.host.EventBus().Subscribe(typ)
	if err != nil {
		return fmt.Errorf("node: subscribe to %T: %w", typ, err)
	}
	n.spawn(func() {
		defer sub.Close()
		for {
			select {
			case <-n.ctx.Done():
				return
			case e, ok := <-sub.Out():
				if !ok {
					return
				}
				f(e)
			}
		}
	})
	return nil
}

// greet runs the dialling side of HelloProtocol with p.
func (n *Node) greet(p peer.ID) {
	ctx, cancel := context.WithTimeout(n.ctx, helloTimeout)
	defer cancel()
	s, err := n.host.NewStream(ctx, p, HelloProtocol)
	if err != nil {
		n.log.Debug("hello: open stream", "peer", p, "err", err)
		return
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(helloTimeout))
	sent := n.helloTo(p)
	if err := writeHello(s, sent); err != nil {
		s.Reset()
		n.log.Debug("hello: send", "peer", p, "err", err)
		return
	}
	h, err := readHello(s)
	if err != nil {
		s.Reset()
		n.helloFailed(p, "hello: bad answer", err)
		return
	}
	n.heard(p, h, sent.Busy, dialled(s))
}

// dialled reports whether s runs on a connection this node opened: busy is
// an answer to this node's dial (see shed.go).
func dialled(s network.Stream) bool { return s.Conn().Stat().Direction == network.DirOutbound }

// handleHello answers a peer's hello with ours.
func (n *Node) handleHello(s network.Stream) {
	p := s.Conn().RemotePeer()
	if !n.helloing.AcquireFor(p, n.rules().Counts(p)) {
		n.helloBusy.Add(1)
		s.Reset()
		return
	}
	defer n.helloing.Release(p)
	defer s.Close()
	s.SetDeadline(time.Now().Add(helloTimeout))
	h, err := readHello(s)
	if err != nil {
		s.Reset()
		n.helloFailed(p, "hello: bad message", err)
		return
	}
	sent := n.helloTo(p)
	if err := writeHello(s, sent); err != nil {
		s.Reset()
		return
	}
	n.heard(p, h, sent.Busy, dialled(s))
}

// helloFailed handles a hello from p that did not arrive whole: bytes that
// break the protocol are a bad hello (counted, warned of); a stream reset,
// a deadline or a connection closed under it are not the peer's bytes
// (a connection opened for one probe and released goes mid-hello) and are
// only logged at debug.
func (n *Node) helloFailed(p peer.ID, msg string, err error) {
	if !errors.Is(err, ErrBadHello) {
		n.log.Debug("hello: cut short", "peer", p, "err", err)
		return
	}
	n.badHelloSeen(p, msg, err)
}

// badHelloSeen warns of a bad hello from p, at most once a minute per peer,
// and counts it. It warns first: once the count has moved, the warning is
// settled.
func (n *Node) badHelloSeen(p peer.ID, msg string, err error) {
	n.helloWarn.warn(n.log, p.String(), msg, "peer", p, "err", err)
	n.badHello.Add(1)
}

// heard records a peer's hello; a new peer of our cluster that counts is
// remembered at once, so a crash right after connecting still finds it
// again on restart.
// A busy peer's referrals are followed if this node dialled it (dialled:
// the hello came on a connection this node opened), and a seeking peer
// this node told it is busy (toldBusy) is sent on (shed.go).
func (n *Node) heard(p peer.ID, m helloMsg, toldBusy, dialled bool) {
	h := m.hello
	if h.Busy && !dialled && h.Cluster == n.cfg.Cluster {
		// Busy answers a dial of this node's: a peer that dialled in
		// and says it would have this node dial whatever it names.
		n.sheds.notDialled.Add(1)
		n.log.Debug("busy hello from a peer this node did not dial; ignored", "peer", p)
		h.Busy = false
	}
	joined := false
	switch {
	case h.Cluster != n.cfg.Cluster:
		n.joinHeard(p, h)
	case h.Busy:
		n.turnedAway(p, m.Referrals)
	default:
		joined = true
		if h.Seeking && toldBusy {
			n.shed(p)
		}
	}
	old, had := n.peers.put(p, h)
	if joined {
		// After the put: whoever sees a join peer joined (tribe status)
		// finds it among the connected peers (ConnectedPeers reads the
		// hellos put). Before it, a look between the two found the join
		// peer joined and the node alone (TestJoinByHostPortLearnsThePeerID,
		// once under make test).
		n.joinHeard(p, h)
	}
	if had && relinkFor(old, h, len(n.host.Network().ConnsToPeer(p)), n.rules().Counts(p)) {
		n.relinkSoon(p)
	}
	if had && old == h {
		return
	}
	if h.Cluster != n.cfg.Cluster {
		n.log.Debug("peer belongs to another cluster", "peer", p, "cluster", h.Cluster)
		return
	}
	n.log.Debug("peer connected", "peer", p, "name", h.Name)
	n.remember(p)
}

// remember keeps p among the peers a restart dials, if it counts: a
// stranger's hello would otherwise push the fleet out of peers.json
// (oldest first), with the addresses it declared. A peer that comes to
// count later is remembered then (see initAuthority).
func (n *Node) remember(p peer.ID) {
	if !n.rules().Counts(p) {
		return
	}
	if n.remembered.seen(p, n.host.Peerstore().Addrs(p), n.now()) {
		n.rememberSoon()
	}
}

// rememberAdmitted remembers p, admitted just now, if it said hello of
// this cluster on a connection still open: a new node meets its seed
// before it knows the admissions that make the seed count.
func (n *Node) rememberAdmitted(p peer.ID) {
	if h, ok := n.peers.get(p); ok && h.Cluster == n.cfg.Cluster && n.isConnected(p) {
		n.remember(p)
	}
}

func writeHello(w io.Writer, h helloMsg) error {
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

// readHello reads one newline-terminated hello of at most maxHelloSize.
func readHello(r io.Reader) (helloMsg, error) {
	buf := make([]byte, 0, 256)
	one := make([]byte, 256)
	for {
		k, err := r.Read(one)
		buf = append(buf, one[:k]...)
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			if i != len(buf)-1 {
				return helloMsg{}, fmt.Errorf("%w: trailing data", ErrBadHello)
			}
			return decodeHello(buf[:i])
		}
		if len(buf) > maxHelloSize {
			return helloMsg{}, fmt.Errorf("%w: over %d bytes", ErrBadHello, maxHelloSize)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return helloMsg{}, fmt.Errorf("%w: stream ended before the message did", ErrBadHello)
			}
			return helloMsg{}, err
		}
	}
}

// relinkFor reports whether a peer that said old before and h now, with
// conns connections to it, is relinked: it restarted while one of them
// stayed (a new boot, and more than the one connection h came on), and
// it counts (the trust model's rule). A relink redials the peer at the
// addresses it gave: a stranger saying a new boot in every hello would
// have this node dial wherever it liked, again and again.
func relinkFor(old, h hello, conns int, counts bool) bool {
	return counts && old.Boot != "" && h.Boot != "" && old.Boot != h.Boot && conns > 1
}

// relinkSoon relinks p, on one goroutine per peer: a restart seen while
// p's relink runs makes it run once more when it ends (the peer restarted
// again, and its new connections may hold a stale one too), so a peer that
// says a new boot in every hello costs one goroutine, not one per hello.
func (n *Node) relinkSoon(p peer.ID) {
	n.relinkMu.Lock()
	defer n.relinkMu.Unlock()
	if _, running := n.relinking[p]; running {
		n.relinking[p] = true
		return
	}
	n.relinking[p] = false
	n.spawn(func() {
		for {
			n.relink(p)
			n.relinkMu.Lock()
			again := n.relinking[p]
			if !again || n.ctx.Err() != nil {
				delete(n.relinking, p)
				n.relinkMu.Unlock()
				return
			}
			n.relinking[p] = false
			n.relinkMu.Unlock()
		}
	})
}

// relinkDelay is how long relink leaves a peer unconnected: long enough
// for pubsub to process the disconnection (it runs on pubsub's event
// loop) before the peer connects again.
const relinkDelay = 2 * time.Second

// relink starts over the link to a peer: one that restarted while we
// held a connection to its previous run, or one missing from the state
// topic while connected (topiclink.go). After a restart the old
// connection is dead but not yet known to be (QUIC notices after its idle
// timeout, 30 s), and pubsub writes to the peer on it, taking the peer's
// new connection for a duplicate: nothing published here reaches the peer
// until then. Closing every connection to it and dialling again after
// relinkDelay gives pubsub a clean new peer on both sides.
func (n *Node) relink(p peer.ID) {
	n.log.Debug("relinking a peer", "peer", p)
	n.relinks.Add(1)
	n.host.Network().ClosePeer(p)
	select {
	case <-time.After(relinkDelay):
	case <-n.ctx.Done():
		return
	}
	if n.host.Network().Connectedness(p) == network.Connected {
		return // it dialled us meanwhile
	}
	ctx, cancel := context.WithTimeout(n.ctx, helloTimeout)
	defer cancel()
	if err := n.host.Connect(ctx, peer.AddrInfo{ID: p}); err != nil {
		n.log.Debug("reconnecting a restarted peer", "peer", p, "err", err)
	}
}
