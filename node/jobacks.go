package node

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/plugins/jobs"
)

// Where acks go. A job's acks are direct entries (gossip.Scope): a target
// hands its ack to the job's writer (on the job's stream, by push, or
// published when the writer is out of reach), trusted writers share them
// among themselves by anti-entropy, and other nodes hold their own acks
// only, unless they ask (a job's status fetches its acks from its writer).
// With every ack on every node, a job to N targets cost every node N
// signature checks and N entries of state for the retention period.
//
// What the writer missed (an ack published while it was down, a push lost
// with its connection) it asks the targets for: every ackFetchEvery, a
// trusted writer fetches the acks of its unfinished jobs that are not
// final here from the targets it is connected to, each key backing off to
// ackFetchMax while it stays unfinal (a long run, a job queued behind
// others).
const (
	ackFetchEvery = 10 * time.Second
	ackFetchMax   = 5 * time.Minute
)

// ackFetches is a trusted writer's side of the acks it asks for.
type ackFetches struct {
	mu sync.Mutex
	// unfinished are the keys of the jobs this node wrote that were not
	// finished when it last looked.
	unfinished map[string]bool
	// due is when each ack key may be asked for again, and its backoff.
	due map[string]ackDue
}

type ackDue struct {
	at    time.Time
	every time.Duration
}

// wrote notes a job this node wrote, to follow until it finishes.
func (f *ackFetches) wrote(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unfinished == nil {
		f.unfinished = map[string]bool{}
	}
	f.unfinished[key] = true
}

// ask reports whether ack key is due at now, and if so sets its next time.
func (f *ackFetches) ask(key string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.due[key]
	if ok && now.Before(d.at) {
		return false
	}
	d.every = min(max(2*d.every, ackFetchEvery), ackFetchMax)
	if !ok {
		d.every = ackFetchEvery
	}
	if f.due == nil {
		f.due = map[string]ackDue{}
	}
	d.at = now.Add(d.every)
	f.due[key] = d
	return true
}

// drop stops following the jobs in ended (a job written meanwhile stays),
// and forgets when to ask for the acks not in acks.
func (f *ackFetches) drop(ended, acks map[string]bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	maps.DeleteFunc(f.unfinished, func(k string, _ bool) bool { return ended[k] })
	maps.DeleteFunc(f.due, func(k string, _ ackDue) bool { return !acks[k] })
}

// following reports whether any job is followed.
func (f *ackFetches) following() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.unfinished) > 0
}

func (f *ackFetches) jobs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.unfinished))
}

// follow replaces the jobs followed with keys: what collectJobs found
// at the loop's start and once a minute, a safety net for the watcher
// (and what prunes the set where no fetch does, without a trust list).
func (f *ackFetches) follow(keys map[string]bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unfinished = keys
}

// fetchMissingAcks asks the targets of this node's unfinished jobs for
// the acks it does not hold final, if this node is where they go: the
// writer, with targets whose acks anti-entropy does not bring it.
func (n *Node) fetchMissingAcks() {
	now := n.now()
	self := n.host.ID()
	ended, asked := map[string]bool{}, map[string]bool{}
	byTarget := map[peer.ID][]string{}
	for _, key := range n.jobs.fetches.jobs() {
		e, ok := n.replica.Get(key)
		if !ok {
			ended[key] = true
			continue
		}
		j, author, err := n.job(e)
		if err != nil || author != self {
			ended[key] = true
			continue
		}
		// From the job's kept row: its acks are read again only once one
		// changed (a job to 5,000 targets with a few of them down stays
		// unfinished until it expires, and reading its acks every pass
		// cost the writer 5,000 decodes each 10 s).
		v := n.keptView(e, j)
		if v.view.State != string(jobs.Pending) {
			ended[key] = true
			continue
		}
		for _, t := range v.unfinal {
			if t.ID == "" {
				t.ID, _ = n.targetByHex(t.Hash)
			}
			if t.ID == "" || t.ID == self.String() {
				continue
			}
			id, err := peer.Decode(t.ID)
			if err != nil || n.replica.ScopeWith(id) == gossip.Full || n.host.Network().Connectedness(id) != network.Connected {
				continue
			}
			k := ackKey(j.ID, id)
			asked[k] = true
			if n.jobs.fetches.ask(k, now) {
				byTarget[id] = append(byTarget[id], k)
			}
		}
	}
	n.jobs.fetches.drop(ended, asked)
	sem := make(chan struct{}, n.cfg.CallParallel)
	var wg sync.WaitGroup
	for id, keys := range byTarget {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(n.ctx, jobWriterSyncTimeout)
			defer cancel()
			st, err := n.replica.FetchKeys(ctx, id, keys...)
			if err != nil && n.ctx.Err() == nil {
				n.log.Debug("asking a target for its acks", "target", id, "acks", len(keys), "err", err)
			}
			n.jobs.acksFetched.Add(int64(st.Applied))
		})
	}
	wg.Wait()
}

// askJobWriter brings this node what job j's writer knows of it: the job,
// pulled, and its acks, fetched where anti-entropy with the writer leaves
// them out. A writer this node is not connected to is dialled (its
// address from its record), as long as a target is not final here: acks
// go to the writer, so without it a target that ran the job shows
// pending. The error says why this node may know less than the writer.
func (n *Node) askJobWriter(ctx context.Context, j *jobs.Job) error {
	w := n.jobWriter(j)
	if w == "" || w == n.host.ID() {
		return nil
	}
	if !n.isConnected(w) {
		if n.summarize(j).State != jobs.Pending {
			return nil // every target final: nothing more to learn
		}
		if err := n.reachWriters(ctx, w); err != nil {
			return fmt.Errorf("its writer %w", err)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, jobWriterSyncTimeout)
	_, err := n.replica.SyncScoped(sctx, w, n.replica.ScopeWith(w))
	cancel()
	if err == nil {
		err = n.fetchAcks(ctx, j, w)
	}
	if err != nil {
		return fmt.Errorf("asking its writer %s: %w", n.nameOf(w), err)
	}
	return nil
}

// reachWriters connects this node to those of writers it is not connected
// to, at once, within jobWriterSyncTimeout, learning their addresses from
// their records. The error names the first it could not reach.
func (n *Node) reachWriters(ctx context.Context, writers ...peer.ID) error {
	ctx, cancel := context.WithTimeout(ctx, jobWriterSyncTimeout)
	defer cancel()
	errs := make([]error, len(writers))
	var wg sync.WaitGroup
	for i, w := range writers {
		if w == "" || w == n.host.ID() || n.isConnected(w) {
			continue
		}
		n.learnRecordAddrs(w)
		wg.Go(func() {
			if err := n.host.Connect(ctx, peer.AddrInfo{ID: w}); err != nil {
				errs[i] = fmt.Errorf("%s could not be reached: %w", n.nameOf(w), err)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// fetchAcks brings this node the acks of job j that it does not hold
// final, from writer w, when anti-entropy with w leaves them out (this
// node is not a trusted writer): a job's status, asked anywhere, is what
// its writer knows.
func (n *Node) fetchAcks(ctx context.Context, j *jobs.Job, w peer.ID) error {
	if w == "" || w == n.host.ID() || n.replica.ScopeWith(w) == gossip.Full || n.host.Network().Connectedness(w) != network.Connected {
		return nil
	}
	var keys []string
	for _, t := range n.summarize(j).Targets {
		if id, err := peer.Decode(t.ID); err == nil && !t.Ack.State.Final() {
			keys = append(keys, ackKey(j.ID, id))
		}
	}
	if len(keys) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, jobWriterSyncTimeout)
	defer cancel()
	_, err := n.replica.FetchKeys(ctx, w, keys...)
	return err
}

// othersAcks are the acks this node holds that other nodes wrote: a node
// that stops being a trusted writer forgets them (no tombstone), as it
// would never have got them otherwise.
func (n *Node) othersAcks() []string {
	return n.acksWhere(func(_, by string) bool { return by != n.jobs.self })
}

// goneAcks are the acks this node holds (its own and others') of jobs not
// in live: forgotten, with no tombstone (acks are direct entries, which
// travel only to the writers, who drop them likewise).
func (n *Node) goneAcks(live map[string]bool) []string {
	// By job, skipping the acks of live jobs: every ack held is read
	// only for the jobs that are gone (a writer holds one per target of
	// every job it keeps: 50,000 read once a minute at 5,000 targets
	// and 10 jobs).
	var out []string
	for _, job := range n.replica.Segments(jobsPrefix) {
		if live[job] {
			continue
		}
		for _, e := range n.replica.Prefix(jobsPrefix + job + "/acks/") {
			out = append(out, e.Key)
		}
	}
	return out
}

// acksWhere are the keys of the acks this node holds for which pick,
// given the job's id and the acking peer's, says yes.
func (n *Node) acksWhere(pick func(job, by string) bool) []string {
	var out []string
	for _, e := range n.replica.Prefix(jobsPrefix) {
		if job, by, ok := strings.Cut(strings.TrimPrefix(e.Key, jobsPrefix), "/acks/"); ok && pick(job, by) {
			out = append(out, e.Key)
		}
	}
	return out
}
