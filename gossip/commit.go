package gossip

import (
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
}

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
		c.qmu.Lock()
		batch := c.queue
		c.queue = nil
		c.qmu.Unlock()
		r.commitBatch(batch)
	}
	return req.changes, req.err
}

// commitBatch stores the entries of batch that would win, then applies
// them. Callers hold r.commits.mu.
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
			if cur == nil || e.newer(&cur.Entry) {
				winner[e.Key] = e
				from[e] = q
			}
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
	if err := r.store.Put(winners...); err != nil {
		for _, q := range batch {
			q.err = err
		}
		return
	}
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
		r.clock = Observe(r.clock, e.HLC)
	}
}
