package gossip

import (
	"fmt"
	"sync"
	"time"
)

// Records of nodes that do not count. With trusted writers set, a node
// that does not count (pending, revoked, a stranger) may still hold its
// record in the state: trusted writers admit nodes by what it says. But
// identities are free to make, and every node holds every record, so one
// peer that can connect could have the whole fleet hold records of as
// many made-up nodes as it liked, each up to MaxValueLen. Such records
// are bounded here: at most MaxPendingRecord bytes each and MaxPending of
// them held (records of revoked nodes aside: revoking made-up nodes makes
// room). Past either, a record is refused as ErrNotAdmitted is (an
// honest peer may hold it: it is dropped, not scored, and taken once its
// author counts, when the node forgets its refusals).
const (
	// MaxPendingRecord bounds the value of one such record: a pending
	// node's record holds its name, addresses and facts (about 1–2 KiB
	// from the built-in facts), no plugins or tasks yet; one that would
	// be larger withholds its facts until it counts (the node does).
	MaxPendingRecord = 8 << 10
	// MaxPending bounds how many such records a node holds (about 16 MiB
	// at most, with each entry's value held twice).
	MaxPending = 1024
	// PendingRewrite is the least time between two versions of such a
	// record by their clocks (a node that does not count waits as long
	// between its own writes); pendingRetake the least time between this
	// node taking one and the next, by its own clock (see checkPending):
	// at most MaxPending of them are held, and so at most
	// MaxPending/pendingRetake versions a second reach each node.
	PendingRewrite = 10 * time.Second
	// pendingRetake is half PendingRewrite: versions written that far
	// apart arrive closer when the first came late (by a pull, the
	// second by pubsub), and one refused waits for the next pull.
	pendingRetake = PendingRewrite / 2
)

// ErrPendingTooLarge, ErrPendingFull and ErrPendingTooSoon refuse a
// record of a node that does not count (see MaxPendingRecord, MaxPending,
// PendingRewrite); all wrap ErrNotAdmitted.
var (
	ErrPendingTooLarge = fmt.Errorf("%w: a record of over %d bytes", ErrNotAdmitted, MaxPendingRecord)
	ErrPendingFull     = fmt.Errorf("%w: %d records of nodes that do not count held already", ErrNotAdmitted, MaxPending)
	ErrPendingTooSoon  = fmt.Errorf("%w: a record written again within %v", ErrNotAdmitted, PendingRewrite)
)

// pendingCount is how many records of nodes that do not count are held:
// counted from the state at most once a pendingRecount, and raised by one
// for each new one taken in between (an overcount, as a record taken may
// lose to another copy, errs on the safe side).
type pendingCount struct {
	mu sync.Mutex
	n  int
	at time.Time
	// taken is when this node took each version of such a record, by
	// key, by its own clock (see checkPending); entries older than
	// pendingRetake are dropped once there are MaxPending.
	taken map[string]takenAt
}

type takenAt struct {
	hash [32]byte
	at   time.Time
}

const pendingRecount = time.Second

// checkPending is checkCounts for e, the record of a node that does not
// count. A tombstone is taken only over a record held (a node may delete
// its own), and a key held, live or deleted, is never a new one: the
// keys held of such nodes, tombstones included, are what MaxPending
// bounds (tombstones are kept for TombstoneGrace, and a bound on live
// records alone would let records and their tombstones pile up).
func (r *Replica) checkPending(e *Signed, signed bool) error {
	if len(e.Value) > MaxPendingRecord {
		return fmt.Errorf("%w: %s by %s holds %d bytes", ErrPendingTooLarge, e.Key, e.Author, len(e.Value))
	}
	p := &r.pending
	now := r.now()
	if held, ok := r.Version(e.Key); ok {
		// A new version of a key held: no more of them, but no sooner
		// than PendingRewrite after the one held, by their clocks (so
		// every node judges alike): each version costs every node a
		// signature check, a store and a relay.
		if e.HLC > held.HLC && e.HLC.Wall().Sub(held.HLC.Wall()) < PendingRewrite {
			return fmt.Errorf("%w: %s by %s, %v after the version held", ErrPendingTooSoon, e.Key, e.Author, e.HLC.Wall().Sub(held.HLC.Wall()))
		}
		if !e.newer(held) {
			return nil // it changes nothing
		}
		// Nor sooner than pendingRetake after this node took the one
		// held, by its own clock: the author picks its clocks, and
		// versions that start in the past, or that share the held one's
		// clock with a higher hash, met the rule above at any pace. A
		// version refused here is taken later (anti-entropy brings it
		// again), so nodes still end with the same one. Versions
		// checked at once (pubsub validates in parallel) all find the
		// same one held: the last taken is what counts, applied or not.
		p.mu.Lock()
		defer p.mu.Unlock()
		if t, ok := p.taken[e.Key]; ok && t.hash != e.Hash && now.Sub(t.at) < pendingRetake && !now.Before(t.at) {
			return fmt.Errorf("%w: %s by %s, %v after this node took the version held", ErrPendingTooSoon, e.Key, e.Author, now.Sub(t.at))
		}
		if signed {
			p.take(e, now)
		}
		return nil
	}
	if e.Deleted {
		return fmt.Errorf("%w: %s by %s deletes a record not held", ErrNotAdmitted, e.Key, e.Author)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Sub(p.at) >= pendingRecount || now.Before(p.at) {
		p.n, p.at = r.pendingHeld(), now
	}
	if p.n >= MaxPending {
		return fmt.Errorf("%w: %s by %s", ErrPendingFull, e.Key, e.Author)
	}
	if signed {
		p.n++
		p.take(e, now)
	}
	return nil
}

// take notes that e was taken at now (an overcount too: it may lose to
// another copy, or an agent's check, before it is applied). Callers hold
// p.mu. Only notes younger than pendingRetake matter, and each key
// gets at most one in that time, so past MaxPending the old ones go.
func (p *pendingCount) take(e *Signed, now time.Time) {
	if p.taken == nil {
		p.taken = map[string]takenAt{}
	}
	if len(p.taken) >= MaxPending {
		for k, t := range p.taken {
			if now.Sub(t.at) >= pendingRetake || now.Before(t.at) {
				delete(p.taken, k)
			}
		}
	}
	p.taken[e.Key] = takenAt{hash: e.Hash, at: now}
}

// pendingHeld counts the record keys held, tombstones included, of nodes
// that do not count, revoked ones aside.
func (r *Replica) pendingHeld() int {
	r.mu.Lock()
	held := r.state.PrefixAll(nodeRecordPrefix)
	r.mu.Unlock()
	n := 0
	for _, e := range held {
		if e.Author != r.self && !r.counts(e.Author) && (r.cfg.Revoked == nil || !r.cfg.Revoked(e.Author)) {
			n++
		}
	}
	return n
}

// nodeRecordPrefix is where node records are (the "node" key kind).
const nodeRecordPrefix = "nodes/"
