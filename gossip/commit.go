package gossip

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"time"
)

// Group commit: every goroutine that stores entries (this node's writes,
// pubsub's batches, pushes, pulls) hands them to commit, and whichever
// holds the commit lock stores everything queued meanwhile in one store
// transaction: one disk sync for all of them instead of one each, with no
// delay for a write that comes alone. A job's writer takes its targets'
// acks this way, dozens arriving at once in one or two syncs. The
// state's lock is not held while the disk syncs: reads go on meanwhile.
type committer struct {
	mu    sync.Mutex // held by the goroutine committing; orders commits
	qmu   sync.Mutex
	queue []*commitReq
	// behind are the keys of entries applied to the state but not
	// stored yet (see commitBehind), guarded by mu; every commit stores
	// them, and flush makes one if none has within BehindFor.
	behind map[string]bool
	flush  *time.Timer
	armed  bool // flush is set and has not fired
}

// BehindFor is how long an entry applied before it is stored (a job's
// final ack its writer took, peers' broadcast entries: commitBehind)
// waits for a commit to store it with before one is made for it: what a
// crash can lose of them.
const BehindFor = time.Second

type commitReq struct {
	entries []*Signed
	changes []*Change
	err     error
	done    bool // guarded by committer.mu
}

// commit stores entries and applies them to the state, together with
// whatever other goroutines are committing; it returns the changes its
// own entries made once they are stored and applied. An entry that lost
// to a newer version of its key (held, or committed at the same time)
// makes no change.
func (r *Replica) commit(entries []*Signed) ([]*Change, error) {
	req := &commitReq{entries: entries}
	c := &r.commits
	c.qmu.Lock()
	c.queue = append(c.queue, req)
	c.qmu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !req.done { // no one took it while this goroutine waited: take all
		r.commitBatch(c.takeQueue())
	}
	return req.changes, req.err
}

// commitBehind applies entries to the state at once and leaves it to the
// next commit to store them, or to a commit BehindFor later: for entries
// other nodes keep durably already, as a job's final ack its writer took
// (see PutBehind), or the broadcast entries peers send (their authors and
// every peer that took them hold them). Until stored they are lost if
// this process dies; the store is never left torn, as every commit
// syncs. Once the replica is closing, entries are committed at once.
func (r *Replica) commitBehind(entries []*Signed) ([]*Change, error) {
	c := &r.commits
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.ctx == nil || r.ctx.Err() != nil {
		return r.commitLocked(entries)
	}
	var changes []*Change
	var errs []error
	r.mu.Lock()
	for _, e := range entries {
		ch, err := r.state.Apply(e, time.Time{}) // checked by the caller
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ch == nil {
			continue
		}
		changes = append(changes, ch)
		r.observe(e)
		if c.behind == nil {
			c.behind = map[string]bool{}
		}
		c.behind[e.Key] = true
	}
	r.mu.Unlock()
	if !c.armed && len(c.behind) > 0 {
		c.armFlush(r)
	}
	return changes, errors.Join(errs...)
}

// armFlush sets flush to commit what is behind in BehindFor (again, if
// that commit fails). Callers hold c.mu.
func (c *committer) armFlush(r *Replica) {
	c.armed = true
	if c.flush != nil {
		c.flush.Reset(BehindFor)
		return
	}
	c.flush = time.AfterFunc(BehindFor, func() {
		c.mu.Lock()
		c.armed = false
		c.mu.Unlock()
		if _, err := r.commit(nil); err != nil {
			r.log.Warn("storing entries applied before they were stored; trying again", "err", err)
			c.mu.Lock()
			defer c.mu.Unlock()
			if !c.armed && len(c.behind) > 0 && r.ctx.Err() == nil {
				c.armFlush(r)
			}
		}
	})
}

// endBehind stops the flush as the replica closes and stores what is
// behind now, or, if store is false (a crash), forgets it.
func (r *Replica) endBehind(store bool) error {
	c := &r.commits
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.flush != nil {
		c.flush.Stop()
		c.armed = false
	}
	if !store || len(c.behind) == 0 {
		clear(c.behind)
		return nil
	}
	_, err := r.commitLocked(nil)
	return err
}

// commitLocked commits entries, with whatever is queued, under the commit
// lock its caller holds.
func (r *Replica) commitLocked(entries []*Signed) ([]*Change, error) {
	req := &commitReq{entries: entries}
	r.commitBatch(append(r.commits.takeQueue(), req))
	return req.changes, req.err
}

// takeQueue empties the queue of commits waiting, for its caller to make.
func (c *committer) takeQueue() []*commitReq {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	q := c.queue
	c.queue = nil
	return q
}

// commitBatch stores the entries of batch that would win, with the
// entries written behind, then applies them. Callers hold r.commits.mu.
func (r *Replica) commitBatch(batch []*commitReq) {
	defer func() {
		for _, q := range batch {
			q.done = true
		}
	}()
	winner := map[string]*Signed{}
	from := map[*Signed]*commitReq{}
	r.mu.Lock()
	for _, q := range batch {
		for _, e := range q.entries {
			cur, ok := winner[e.Key]
			if !ok {
				cur, _ = r.state.Version(e.Key)
			}
			if cur == nil || e.newer(cur) {
				winner[e.Key] = e
				from[e] = q
			}
		}
	}
	// Entries written behind are stored as the state holds them now (a
	// newer version in this batch is stored instead).
	var behind []*Signed
	for k := range r.commits.behind {
		if cur, ok := r.state.Version(k); ok && winner[k] == nil {
			behind = append(behind, cur)
		}
	}
	r.mu.Unlock()
	winners := make([]*Signed, 0, len(winner))
	for _, e := range winner {
		winners = append(winners, e)
	}
	// In key order: bbolt inserts sorted keys fastest, and watchers see a
	// batch in a repeatable order.
	slices.SortFunc(winners, func(a, b *Signed) int { return strings.Compare(a.Key, b.Key) })
	stored := winners
	if len(behind) > 0 {
		stored = append(slices.Clip(winners), behind...)
		slices.SortFunc(stored, func(a, b *Signed) int { return strings.Compare(a.Key, b.Key) })
	}
	if err := r.store.Put(stored...); err != nil {
		for _, q := range batch {
			q.err = err
		}
		return
	}
	clear(r.commits.behind)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range winners {
		q := from[e]
		c, err := r.state.Apply(e, time.Time{}) // checked by the caller
		if err != nil {
			q.err = err
			continue
		}
		if c != nil {
			q.changes = append(q.changes, c)
		}
		r.observe(e)
	}
}

// observe moves this node's clock past e's (callers hold r.mu), if e's
// author is this node or counts: the clock orders a write made after
// seeing another one over it, and only nodes that count write keys this
// node writes too, or that it weighs against its own (a force-leave
// against the record of a node that counts). A stranger's record, taken up to
// MaxClockSkew ahead, moved the clock as far: this node's next writes
// were then refused as from the future, and not passed on, by every node
// whose clock ran a moment behind, and each new record did it again.
func (r *Replica) observe(e *Signed) {
	if e.HLC > r.clock && (e.Author == r.self || r.counts(e.Author)) {
		r.clock = e.HLC
	}
}
