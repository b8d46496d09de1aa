package node

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/record"
)

// Liveness: a node is left when it said so (see reap.go); otherwise alive while it is connected to us or was heard from
// (a presence message) within presenceTimeout = 3 presence intervals;
// suspect while silent for up to twice that; dead after. Connectivity alone
// would miss nodes we are not directly connected to, and a killed peer's
// QUIC connection lingers for its idle timeout; presence alone would
// depend on gossip reaching us.

// Liveness states.
const (
	Alive   = "alive"
	Suspect = "suspect"
	Dead    = "dead"
)

// liveness is the pure rule above.
func liveness(connected bool, lastHeard, now time.Time, timeout time.Duration) string {
	silent := now.Sub(lastHeard)
	switch {
	case connected || (!lastHeard.IsZero() && silent <= timeout):
		return Alive
	case !lastHeard.IsZero() && silent <= 2*timeout:
		return Suspect
	}
	return Dead
}

// presenceRecord is the signed heartbeat: the sender's wall clock. The
// envelope's signer is the node it speaks for.
type presenceRecord struct{ ms int64 }

const presenceDomain = "tribe-presence"

var presenceType = []byte("/tribe/presence/1")

func (*presenceRecord) Domain() string { return presenceDomain }
func (*presenceRecord) Codec() []byte  { return presenceType }
func (p *presenceRecord) MarshalRecord() ([]byte, error) {
	return binary.BigEndian.AppendUint64(nil, uint64(p.ms)), nil
}
func (p *presenceRecord) UnmarshalRecord(b []byte) error {
	if len(b) != 8 {
		return fmt.Errorf("presence: %d bytes, want 8", len(b))
	}
	p.ms = int64(binary.BigEndian.Uint64(b))
	return nil
}

// ErrBadPresence is returned for presence messages that do not verify.
var ErrBadPresence = errors.New("node: bad presence message")

// openPresence verifies a presence message and returns who sent it when.
func openPresence(b []byte) (peer.ID, time.Time, error) {
	if len(b) > 512 {
		return "", time.Time{}, fmt.Errorf("%w: %d bytes", ErrBadPresence, len(b))
	}
	var rec presenceRecord
	env, err := record.ConsumeTypedEnvelope(b, &rec)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("%w: %v", ErrBadPresence, err)
	}
	if string(env.PayloadType) != string(presenceType) {
		return "", time.Time{}, fmt.Errorf("%w: payload type", ErrBadPresence)
	}
	id, err := peer.IDFromPublicKey(env.PublicKey)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("%w: %v", ErrBadPresence, err)
	}
	return id, time.UnixMilli(rec.ms), nil
}

func sealPresence(key crypto.PrivKey, now time.Time) ([]byte, error) {
	env, err := record.Seal(&presenceRecord{ms: now.UnixMilli()}, key)
	if err != nil {
		return nil, err
	}
	return env.Marshal()
}

// presence tracks when each node was last heard from.
type presence struct {
	mu    sync.Mutex
	heard map[peer.ID]time.Time
	sent  map[peer.ID]time.Time // the sender's time of the latest message from each node
	bad   int64
}

func (p *presence) seen(id peer.ID, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if at.After(p.heard[id]) {
		p.heard[id] = at
	}
}

// newer records at as id's latest message time and reports whether it is
// later than the one before.
func (p *presence) newer(id peer.ID, at time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !at.After(p.sent[id]) {
		return false
	}
	p.sent[id] = at
	return true
}

func (p *presence) last(id peer.ID) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.heard[id]
}

// acceptPresence checks a presence message and records when its node was
// heard, or counts it as bad. A message says "alive at its time": one
// from the future, one older than the timeout, or one no newer than the
// last from that node is a replay or a lie, and keeps nobody alive (a dead
// node's old messages, replayed, once did).
func (n *Node) acceptPresence(b []byte) error {
	id, at, err := openPresence(b)
	now := n.now()
	switch {
	case err != nil:
	case at.After(now.Add(time.Minute)):
		err = fmt.Errorf("%w: from the future", ErrBadPresence)
	case at.Before(now.Add(-3*n.cfg.PresenceInterval - time.Minute)):
		err = fmt.Errorf("%w: stale", ErrBadPresence)
	case !n.presence.newer(id, at):
		err = fmt.Errorf("%w: replayed", ErrBadPresence)
	}
	if err != nil {
		n.presence.mu.Lock()
		n.presence.bad++
		n.presence.mu.Unlock()
		return err
	}
	// Record the time we heard it, not the sender's clock.
	n.presence.seen(id, now)
	return nil
}

// watchDisconnects counts the end of a connection as hearing from the peer:
// it was alive until then. Without it a node killed before any of its
// presence messages arrived (in its first seconds, while the meshes form)
// went from alive straight to dead, skipping suspect.
func (n *Node) watchDisconnects() error {
	return n.onEvent(new(event.EvtPeerConnectednessChanged), func(e any) {
		if ev := e.(event.EvtPeerConnectednessChanged); ev.Connectedness == network.NotConnected {
			n.presence.seen(ev.Peer, n.now())
		}
	})
}

// startPresence joins the presence topic, records what it hears and
// announces this node every PresenceInterval.
func (n *Node) startPresence(ps *pubsub.PubSub, key crypto.PrivKey) error {
	topic := "tribe/" + n.cfg.Cluster + "/presence/1"
	err := ps.RegisterTopicValidator(topic, func(_ context.Context, _ peer.ID, m *pubsub.Message) pubsub.ValidationResult {
		if n.acceptPresence(m.Data) != nil {
			return pubsub.ValidationReject
		}
		return pubsub.ValidationAccept
	})
	if err != nil {
		return fmt.Errorf("node: presence: %w", err)
	}
	t, err := ps.Join(topic)
	if err != nil {
		return fmt.Errorf("node: presence: %w", err)
	}
	// Relay, not Subscribe: the validator records what is heard, so
	// nothing needs delivering here (a subscription's buffer overflowed
	// in a 300-node simulation, counted as drops, when its reader lagged).
	stopRelay, err := t.Relay()
	if err != nil {
		return fmt.Errorf("node: presence: %w", err)
	}
	n.spawn(func() {
		defer t.Close()
		defer stopRelay()
		for {
			// A leaving node is silent: presence sent after its farewell
			// would bring it back (see reap.go).
			n.leaveMu.Lock()
			if n.leaving {
				n.leaveMu.Unlock()
				return
			}
			msg, err := sealPresence(key, n.now())
			n.leaveMu.Unlock()
			if err == nil {
				t.Publish(n.ctx, msg)
			}
			if !n.sleep(time.Duration(float64(n.cfg.PresenceInterval) * (0.9 + 0.2*n.float()))) {
				return
			}
		}
	})
	return nil
}

func (p *presence) lastSent(id peer.ID) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent[id]
}

// liveness tells whether p is alive, suspect, dead or left now.
func (n *Node) liveness(p peer.ID) string {
	if p == n.host.ID() {
		return Alive
	}
	return n.view(p).state(n.now(), 3*n.cfg.PresenceInterval)
}

// reaped reports whether p is out of this node's views (see reap.go).
func (n *Node) reaped(p peer.ID) bool {
	if p == n.host.ID() {
		return false
	}
	return n.view(p).reaped(n.now(), 3*n.cfg.PresenceInterval, n.settings().reconnectTimeout)
}

// view gathers what the liveness and reaping rules need about p.
func (n *Node) view(p peer.ID) peerView {
	v := peerView{connected: n.isConnected(p), heard: n.presence.last(p), sent: n.presence.lastSent(p)}
	if e, ok := n.replica.Get(nodesPrefix + p.String()); ok {
		v.record = e.HLC
		if rec, _ := n.nodeNamed(p); rec.Left {
			v.leftAt = rec.LeftAt
			if v.leftAt.IsZero() {
				v.leftAt = e.HLC.Wall()
			}
		}
	}
	if e, ok := n.replica.Get(forcedPrefix + p.String()); ok {
		v.forced = e.HLC
	}
	return v
}
