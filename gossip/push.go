package gossip

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// PushProtocol hands one entry (its signed envelope, then the end of the
// stream), authored by the sender, straight to a peer, which stores it and answers with one byte. A node that leaves the
// cluster pushes its farewell record this way to know it reached someone
// before it closes: pubsub gives no such word, and anti-entropy is a pull.
// Only the sender's own entries are taken, so a push spreads nothing a
// peer could not publish on the topic itself; everything else is refused
// and counted like a bad topic message (one from another author as
// unauthorized).
const PushProtocol = "/tribe/push/1.0.0"

// pushTimeout bounds one push on either side.
const pushTimeout = 10 * time.Second

// ErrNotOwnEntry refuses a pushed entry its sender did not author.
var ErrNotOwnEntry = errors.New("gossip: pushed entry not authored by its sender")

// Push hands s to p and returns once p has stored it (or refused it, an
// error). s must be this replica's own entry.
func (r *Replica) Push(ctx context.Context, p peer.ID, s *Signed) error {
	ctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	st, err := r.h.NewStream(ctx, p, PushProtocol)
	if err != nil {
		return fmt.Errorf("gossip: push to %s: %w", p, err)
	}
	defer st.Close()
	if dl, ok := ctx.Deadline(); ok {
		st.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { st.Reset() })
	defer stop()
	if _, err := st.Write(s.Raw); err != nil {
		return fmt.Errorf("gossip: push to %s: %w", p, err)
	}
	st.CloseWrite()
	var ack [1]byte
	if _, err := io.ReadFull(st, ack[:]); err != nil {
		return fmt.Errorf("gossip: push to %s: no answer: %w", p, err)
	}
	if ack[0] != 1 {
		return fmt.Errorf("gossip: push to %s: refused", p)
	}
	return nil
}

// servePush takes one pushed entry, checked as the topic validator
// checks a message, plus that its sender wrote it.
func (r *Replica) servePush(s network.Stream) {
	from := s.Conn().RemotePeer()
	// Bounded like sync's serving: a peer in its cool-down is not served,
	// and a few pushes at once are plenty (one entry each, as a node
	// leaves).
	counts := r.counts(from)
	if r.penalties.active(from, r.now()) || !r.pushing.AcquireFor(from, counts) {
		r.counters.pushBusy.Add(1)
		s.Reset()
		return
	}
	// The entry must come whole within firstRequest (a timer: see
	// serveSyncIn); storing it and answering have the rest of
	// pushTimeout.
	s.SetDeadline(time.Now().Add(pushTimeout))
	first := time.AfterFunc(r.firstRequest, func() { s.Reset() })
	b, err := io.ReadAll(io.LimitReader(s, MaxEntrySize+1))
	first.Stop()
	if err != nil {
		r.pushing.Release(from)
		r.stalled(s, "push", counts, err)
		return
	}
	// The slot is given back before the answer: a sender that pushes
	// again as soon as it reads one must find it free.
	ok := r.takePushed(b, from)
	r.pushing.Release(from)
	answer := byte(0)
	if ok {
		answer = 1
	}
	s.Write([]byte{answer})
	s.Close()
}

// takePushed stores the entry b pushed by from if it passes; a refused
// one is counted by reason (false).
func (r *Replica) takePushed(b []byte, from peer.ID) bool {
	if _, err := r.Accept(from, b); err != nil {
		r.log.Debug("rejected a pushed entry", "from", from, "err", err)
		return false
	}
	return true
}

// Accept takes one entry that its author, from, handed this node
// directly (a push, or another protocol's payload, as a job handed to its
// target): checked as the topic validator checks a message, plus that
// from wrote it and that the agent admits it (ReplicaConfig.Admit), then
// stored and applied. A refused entry is counted by reason and changes
// nothing. It returns the entry taken.
func (r *Replica) Accept(from peer.ID, raw []byte) (*Signed, error) {
	e, err := r.Check(from, raw)
	if err != nil {
		return nil, err
	}
	r.applyRemote([]*Signed{e})
	return e, nil
}

// Check is Accept without storing the entry: for a caller that stores it
// together with a write of its own (PutQuietWith), or later (Apply).
func (r *Replica) Check(from peer.ID, raw []byte) (*Signed, error) {
	var e *Signed
	var err error
	if len(raw) > MaxEntrySize {
		err = fmt.Errorf("%w: pushed entry over %d bytes", ErrTooLarge, MaxEntrySize)
	} else {
		e, err = Open(raw)
	}
	if err == nil && e.Author != from {
		// Counted as unauthorised: the sender may push only its own.
		err = fmt.Errorf("%w: %w: %s from %s", ErrUnauthorized, ErrNotOwnEntry, e.Key, from)
	}
	if err == nil {
		err = r.check(e, r.now())
	}
	if err != nil {
		r.counters.reject(err)
		return nil, err
	}
	if r.cfg.Admit != nil {
		if err := r.cfg.Admit(e, r.Get); err != nil { // counted by Admit
			return nil, err
		}
	}
	return e, nil
}

// Apply stores and applies entries that Check took.
func (r *Replica) Apply(entries ...*Signed) error {
	changes, err := r.commit(entries)
	r.notify(changes)
	return err
}
