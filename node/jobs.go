package node

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/plugins/jobs"
)

// Durable jobs (plugins/jobs holds the rule): a trusted writer writes
// jobs/<id> with the targets fixed; each target runs it once when it sees
// it and acknowledges in jobs/<id>/acks/<its peer ID>. The own ack is the
// journal: it is stored (bbolt, fsync) as running before the plugin is
// called, so a crash mid-run is found at the next start. The whole output
// stays in <data-dir>/jobs/<id>.out; the ack carries its head and digest.

const jobsPrefix = "jobs/"

func jobKey(id string) string { return jobsPrefix + id }

func ackKey(id string, p peer.ID) string { return jobsPrefix + id + "/acks/" + p.String() }

// jobCollectEvery is how often a node looks for finished jobs past their
// retention (trusted writers delete them) and for its acks of deleted jobs.
const jobCollectEvery = time.Minute

// jobOutputMax caps the output a target keeps of one run.
const jobOutputMax = 1 << 20

// jobSet is this node's side of jobs.
type jobSet struct {
	runner jobs.Runner
	poke   chan struct{}

	mu    sync.Mutex
	cache map[string]cachedJob // decoded job entries, by key
	acks  map[string]cachedAck // decoded own acks, by job id
	self  string               // this node's peer ID, as in ack keys; set in New
	// targets maps the 8-byte target hashes jobs carry to the node
	// records' peer IDs, kept by a watcher (initJobs): a job's
	// status looks up each of its targets, and would otherwise hash
	// every node's ID at every ack.
	targets map[[8]byte]string
	// waiting are the job streams that wait for this node's final ack
	// of their job, by job id (see serveJob).
	waiting map[string]chan *gossip.Signed
	// handed are jobs handed to this node and checked but not stored
	// yet, by key: the job loop stores each with its running ack if it
	// runs it at once, in one disk sync, else alone (see serveJob).
	handed map[string]*handedJob
	// open are the keys of the jobs the job loop decides on: every job
	// held but those settled here, whose own ack is final and which are
	// not parallel (Decide skips a final ack, and a queued job that
	// follows a job that is not parallel needs only that it is known).
	// Each step read every retained job before: 0.9 ms a step with 500
	// retained against 2 µs with none (BenchmarkJobStepRetained), and a
	// node steps at every change of a job or of its ack. Keys come from
	// the job watcher (every change of a job entry), and from the whole
	// state when the loop starts and once a minute (openAll); a step
	// takes out what it settled (settle).
	open map[string]bool

	recall ownAckRecall // own acks asked of writers after a start (jobrecall.go)

	unreadable      atomic.Int64 // job or ack entries this version cannot read
	acksPublished   atomic.Int64 // acks published because the writer was out of reach
	acksHeld        atomic.Int64 // acks kept for the writer: a trust list, no trusted writer in reach
	jobsPublished   atomic.Int64 // jobs published to every node (deliverJob)
	acksFetched     atomic.Int64 // acks this writer asked targets for and got (jobacks.go)
	fetches         ackFetches   // what this writer asks targets for (jobacks.go)
	handRefused     atomic.Int64 // job streams that carried no job this node takes
	ackRefused      atomic.Int64 // acks from peers that are not targets, or of jobs not held (admitAck)
	handBusy        atomic.Int64 // job streams refused: too many open, or the peer cooling down
	handUnstored    atomic.Int64 // job streams answered refused: the job loop did not store the job in time
	handing         *gossip.Slots
	outputRefused   atomic.Int64 // output requests refused (not trusted, busy, malformed)
	outputBadAnswer atomic.Int64 // output answers (of a target asked) that did not read
	listBadAnswer   atomic.Int64 // list answers (of a writer asked) that did not read, or were over the cap
	outputs         *gossip.Slots
	listing         *gossip.Slots
	listRefused     atomic.Int64        // job list requests refused (not admitted, malformed, busy)
	views           map[string]listView // jobs' rows in a list, by job id (joblist.go)
	viewGens        map[string]uint64   // changes of each job and its acks seen by dropView
	viewsMade       atomic.Int64        // rows made, not kept
}

type cachedJob struct {
	hash   [32]byte
	job    *jobs.Job
	author peer.ID
	err    error
	// targets is the job's target set, made the first time an ack of
	// this version is checked (isTarget).
	targets map[[8]byte]bool
}

type cachedAck struct {
	hash [32]byte
	ack  jobs.Ack
	ok   bool
}

func (s *jobSet) pokeLoop() {
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// job decodes a job entry, once per version.
func (n *Node) job(e *gossip.Signed) (*jobs.Job, peer.ID, error) {
	s := &n.jobs
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.cache[e.Key]; ok && c.hash == e.Hash {
		return c.job, c.author, c.err
	}
	j, err := jobs.Decode(e.Value)
	if err == nil && jobKey(j.ID) != e.Key {
		err = errors.New("the job's id is not its key's")
	}
	c := cachedJob{hash: e.Hash, job: &j, author: e.Author, err: err}
	if err != nil {
		s.unreadable.Add(1)
		n.log.Warn("a job entry this agent cannot read", "key", e.Key, "author", e.Author, "err", err)
		c.job = nil
	}
	if s.cache == nil {
		s.cache = map[string]cachedJob{}
	}
	s.cache[e.Key] = c
	return c.job, c.author, err
}

// isJobKey reports whether key is jobs/<id> (not an ack).
func isJobKey(key string) bool {
	return strings.HasPrefix(key, jobsPrefix) && !strings.Contains(key[len(jobsPrefix):], "/")
}

// openAll puts every job held in open.
func (n *Node) openAll() {
	for _, e := range n.replica.Children(jobsPrefix) {
		n.jobs.reopen(e.Key)
	}
}

// reopen puts job key in open: the job loop decides on it again.
func (s *jobSet) reopen(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open == nil {
		s.open = map[string]bool{}
	}
	s.open[key] = true
}

// openJobs are the readable live jobs in open, by key; a key whose job is
// gone or unreadable leaves open (a new version comes back through the
// watcher).
func (n *Node) openJobs() []*jobs.Job {
	s := &n.jobs
	s.mu.Lock()
	keys := slices.Sorted(maps.Keys(s.open))
	s.mu.Unlock()
	var out []*jobs.Job
	var gone []string
	for _, k := range keys {
		e, ok := n.replica.Get(k)
		if !ok {
			gone = append(gone, k)
			continue
		}
		j, _, err := n.job(e)
		if err != nil {
			gone = append(gone, k)
			continue
		}
		out = append(out, j)
	}
	s.close(gone)
	return out
}

// settle takes out of open the jobs of a step that are settled here: its
// own ack is final, or it is not this node's and cannot become so (not a
// target, and not a job that takes new members before it expires, as a
// writer holds the jobs it wrote). Parallel jobs stay: a queued job that
// follows one looks past it. So does a job whose entry changed since the
// step read it: the step after decides on the new version.
func (n *Node) settle(live []*jobs.Job) {
	now := n.now()
	var done []string
	for _, j := range live {
		if j.Parallel {
			continue
		}
		if e, ok := n.replica.Get(jobKey(j.ID)); !ok {
			continue // handed, not stored yet; or gone (openJobs drops it)
		} else if cur, _, err := n.job(e); err != nil || cur != j {
			continue
		}
		a, acked := n.ownAck(j.ID)
		if acked && a.State.Final() || !acked && !j.Targeted(n.jobs.self) && (!j.IncludeNew || !now.Before(j.Expires)) {
			done = append(done, jobKey(j.ID))
		}
	}
	n.jobs.close(done)
}

func (s *jobSet) close(keys []string) {
	if len(keys) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		delete(s.open, k)
	}
}

// knownJobs are the readable live jobs (not their acks: a writer holds
// every target's).
func (n *Node) knownJobs() []*jobs.Job {
	var out []*jobs.Job
	for _, e := range n.replica.Children(jobsPrefix) {
		if j, _, err := n.job(e); err == nil {
			out = append(out, j)
		}
	}
	return out
}

// jobHost is the node as plugins/jobs sees it, for one step: the live
// jobs are read once, for both Jobs and Acks.
type jobHost struct {
	n    *Node
	live []*jobs.Job
	read bool
}

func (h *jobHost) Self() string   { return h.n.jobs.self }
func (h *jobHost) Now() time.Time { return h.n.now() }
func (h *jobHost) Jobs() []*jobs.Job {
	if !h.read {
		h.live, h.read = h.n.openJobs(), true
		for _, hj := range h.n.jobs.pendingHanded() {
			if _, held := h.n.replica.Version(hj.e.Key); held {
				continue // stored since knownJobs read: the next step sees it
			}
			if j, _, err := h.n.job(hj.e); err == nil {
				h.live = append(h.live, j)
			}
		}
	}
	return h.live
}

func (h *jobHost) Known(id string) bool {
	_, ok := h.n.replica.Version(jobKey(id))
	return ok || h.n.jobs.isHanded(jobKey(id))
}

func (h *jobHost) Acks() map[string]jobs.Ack {
	out := map[string]jobs.Ack{}
	for _, j := range h.Jobs() {
		if a, ok := h.n.ownAck(j.ID); ok {
			out[j.ID] = a
		}
	}
	return out
}

func (h *jobHost) Member(tribe string) bool { return h.n.isMember(tribe, h.n.host.ID()) }

func (h *jobHost) PutAck(id string, a jobs.Ack) error {
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	n := h.n
	// Stored (the journal) but not published: an ack is for the job's
	// writer, where `job wait` most likely runs, and goes there by push.
	// A job handed and not stored yet is stored with it.
	hj := n.jobs.claimHanded(jobKey(id))
	var with []*gossip.Signed
	if hj != nil {
		with = append(with, hj.e)
	}
	// A final ack goes back on the stream that brought the job, if one
	// waits for it (see serveJob), as soon as it is signed; the writer
	// stores it, and this node stores its own copy with its next commit
	// (at most a second later), not with a disk sync of its own: with
	// 25 agents on one disk the syncs were most of a job's time, and a
	// target now syncs once a job. If this process dies before its copy
	// is stored, the journal still says running, and at the next start
	// the node asks the writer for the ack it sent before it decides on
	// the job (jobrecall.go); if the writer did not get it either, the
	// run was interrupted. An ack that goes by push is stored first.
	answered := false
	var s *gossip.Signed
	if a.State.Final() && hj == nil {
		s, err = n.replica.PutBehind(n.ctx, n.ownAckKey(id), b, func(s *gossip.Signed) bool {
			answered = n.jobs.answer(id, s)
			return answered
		})
	} else {
		s, err = n.replica.PutQuietWith(n.ctx, n.ownAckKey(id), b, with...)
	}
	if hj != nil {
		hj.stored(err)
	}
	if err != nil {
		return err
	}
	if answered {
		return nil
	}
	after := time.Duration(0)
	if a.State == jobs.Running {
		// Most runs end in milliseconds, and their final ack says all
		// there is.
		after = runningShareAfter
	}
	n.spawn(func() {
		select {
		case <-time.After(after):
			n.shareAck(id, s)
		case <-n.ctx.Done():
		}
	})
	return nil
}

// runningShareAfter is how long a run goes before its running ack is
// sent to the job's writer. Until then the writer sees it pending.
const runningShareAfter = time.Second

// shareAck hands an ack, if still this node's latest, straight to the
// job's writer: one stream, like a call's answer. Published to every node
// instead, each ack of a job to N targets reached N nodes: N² deliveries
// per job, which on 25 agents made a job cost each agent 50 times what a
// call to the same 25 did. Other trusted writers get acks by
// anti-entropy, a node asked for a job's status fetches them from its
// writer (jobacks.go). If the writer cannot be reached, the ack goes to
// the other trusted writers in reach, or, with no trust list, is
// published, so that it reaches whoever watches; the writer asks for it
// later if it missed it.
func (n *Node) shareAck(id string, s *gossip.Signed) {
	if cur, ok := n.replica.Get(s.Key); ok && cur.HLC > s.HLC {
		return // a later ack replaced it
	}
	e, ok := n.replica.Get(jobKey(id))
	if !ok {
		return
	}
	_, author, err := n.job(e)
	if err != nil || author == n.host.ID() {
		return
	}
	if n.host.Network().Connectedness(author) == network.Connected {
		err := n.replica.Push(n.ctx, author, s)
		if err == nil || n.ctx.Err() != nil {
			return
		}
		n.log.Debug("pushing an ack to the job's writer", "job", id, "err", err)
	}
	if t := n.replica.Trust(); !t.Open() {
		// With a trust list an ack is for its target and the trusted
		// writers alone (a pull serves it to no one else): published,
		// it reached every peer on the state topic, strangers too, with
		// the head of the job's output.
		pushed := false
		for _, w := range t.Peers() {
			if w != author && w != n.host.ID() && n.isConnected(w) {
				pushed = n.replica.Push(n.ctx, w, s) == nil || pushed
			}
		}
		if !pushed {
			n.jobs.acksHeld.Add(1)
		}
		return
	}
	n.jobs.acksPublished.Add(1)
	n.replica.Announce(n.ctx, s)
}

// jobWriter is who wrote job j (empty if this node no longer holds it).
func (n *Node) jobWriter(j *jobs.Job) peer.ID {
	if e, ok := n.replica.Get(jobKey(j.ID)); ok {
		return e.Author
	}
	return ""
}

// syncJobWriters pulls from each of writers this node is connected to
// what it lacks: jobs go to their targets and reach other nodes only by
// anti-entropy, and acks go to the writers (jobacks.go); in scope Full, if
// given, the pull brings the acks the writer holds too. Best effort,
// bounded: an unreachable writer leaves the status as this node knows it.
func (n *Node) syncJobWriters(ctx context.Context, writers ...peer.ID) {
	n.syncJobWritersIn(ctx, gossip.Shared, writers...)
}

func (n *Node) syncJobWritersIn(ctx context.Context, sc gossip.Scope, writers ...peer.ID) {
	for _, w := range writers {
		if w == "" || w == n.host.ID() || n.host.Network().Connectedness(w) != network.Connected {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, jobWriterSyncTimeout)
		scope := n.replica.ScopeWith(w)
		if sc == gossip.Full {
			scope = gossip.Full
		}
		if _, err := n.replica.SyncScoped(sctx, w, scope); err != nil && ctx.Err() == nil {
			n.log.Debug("pulling jobs and acks from a job writer", "writer", w, "err", err)
		}
		cancel()
	}
}

// jobWriterSyncTimeout bounds one pull from a job's writer for a status.
const jobWriterSyncTimeout = 2 * time.Second

// ownAckKey is the key of this node's ack of job id (ackKey without
// encoding the peer ID each time: the job loop asks at every step).
func (n *Node) ownAckKey(id string) string { return jobsPrefix + id + "/acks/" + n.jobs.self }

// ownAck is this node's ack of job id, decoded once per version: the job
// loop looks at every live job's at each step.
func (n *Node) ownAck(id string) (jobs.Ack, bool) {
	e, ok := n.replica.Get(n.ownAckKey(id))
	if !ok {
		return jobs.Ack{}, false
	}
	s := &n.jobs
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.acks[id]; ok && c.hash == e.Hash {
		return c.ack, c.ok
	}
	a, err := jobs.DecodeAck(e.Value)
	if err != nil { // its own, from another version: start over from it
		s.unreadable.Add(1)
	}
	if s.acks == nil {
		s.acks = map[string]cachedAck{}
	}
	s.acks[id] = cachedAck{hash: e.Hash, ack: a, ok: err == nil}
	return a, err == nil
}

// jobLoop runs the jobs that reach this node, when a job or this node's
// memberships change and when the plan asks to be woken.
func (n *Node) jobLoop() {
	self := n.host.ID().String()
	defer n.replica.Watch(jobsPrefix, func(c gossip.Change) {
		if isJobKey(c.Key) {
			n.jobs.reopen(c.Key)
			if c.New != nil && !c.New.Deleted && c.New.Author.String() == self {
				n.jobs.fetches.wrote(c.Key)
			}
		}
		if isJobKey(c.Key) || strings.HasSuffix(c.Key, "/acks/"+self) {
			n.jobs.pokeLoop()
		}
	})()
	defer n.replica.Watch(tribesPrefix, func(c gossip.Change) {
		if strings.Contains(c.Key, "/members/"+self+"/") {
			n.jobs.pokeLoop()
		}
	})()
	wake := time.NewTimer(time.Hour)
	defer wake.Stop()
	collect := time.NewTicker(jobCollectEvery)
	defer collect.Stop()
	// Armed only while this node is a trusted writer with unfinished
	// jobs: no other node wakes for it.
	var fetch <-chan time.Time
	var fetching atomic.Bool
	n.openAll() // after the watcher is in place: no job is missed between
	n.collectJobs()
	n.jobs.pokeLoop()
	for {
		if fetch == nil && n.jobs.fetches.following() {
			if t := n.replica.Trust(); !t.Open() && t.Trusted(n.host.ID()) {
				fetch = time.After(ackFetchEvery)
			}
		}
		select {
		case <-n.ctx.Done():
			return
		case <-n.jobs.poke:
		case <-wake.C:
		case <-collect.C:
			n.collectJobs()
			n.openAll() // a safety net: open is rebuilt from the state
			n.jobs.pokeLoop()
			continue
		case <-fetch:
			fetch = nil
			if fetching.CompareAndSwap(false, true) {
				n.spawn(func() {
					defer fetching.Store(false)
					n.fetchMissingAcks()
				})
			}
			continue
		}
		h := &jobHost{n: n}
		if js := n.unrecalled(h.Jobs()); len(js) > 0 {
			// Nothing is decided until a writer was asked (or could
			// not be in time): a job held back would let a later job
			// of its tribe run before it.
			n.recallOwnAcks(js)
			n.storeHanded()
			continue
		}
		runs, at, err := n.jobs.runner.Step(h)
		if err != nil && n.ctx.Err() == nil {
			n.log.Warn("jobs", "err", err)
		}
		n.settle(h.live)
		for _, r := range runs {
			n.spawn(func() { n.runJob(r) })
		}
		n.storeHanded() // the jobs handed that did not start now
		if !at.IsZero() {
			wake.Reset(max(at.Sub(n.now()), 10*time.Millisecond))
		}
	}
}

// runJob makes one attempt and writes how it ended.
func (n *Node) runJob(r jobs.Run) {
	res := n.callJob(r.Job)
	if n.ctx.Err() != nil {
		// The agent stops: the running ack stays, and the next start
		// reports the attempt interrupted (or retries it).
		return
	}
	if len(res.Output) > jobOutputMax {
		res.Output = res.Output[:jobOutputMax]
	}
	if !jobs.HeadHoldsAll(res.Output) {
		if err := n.saveJobOutput(r.Job.ID, res.Output); err != nil {
			n.log.Warn("keeping a job's output", "job", r.Job.ID, "err", err)
		}
	}
	if err := n.jobs.runner.Finish(&jobHost{n: n}, r, res); err != nil && n.ctx.Err() == nil {
		n.log.Warn("acknowledging a job", "job", r.Job.ID, "err", err)
	}
	n.log.Debug("job ran", "job", r.Job.ID, "ok", res.OK, "err", res.Error)
}

// callJob calls the job's plugin here, under the same authorisation as a
// call from its writer: loaded in a tribe of the job this node is a member
// of (or, for a job sent to named nodes, any tribe that loaded it).
func (n *Node) callJob(j *jobs.Job) jobs.Result {
	e, ok := n.replica.Get(jobKey(j.ID))
	if !ok {
		return jobs.Result{Error: "the job was deleted"}
	}
	inst, err := n.authorizeJob(e.Author, j)
	if err != nil {
		// The plugin loop may not have caught up with the state yet (the
		// job came with its plugin entry, or just after a restart): load
		// what the state asks, then look again, or the job would fail as
		// if it never would be. Not before every run: a reconcile walks
		// every tribe and plugin (2.5% of a target's CPU in 25-agent job
		// bursts), and a call does without it.
		n.reconcilePlugins()
		inst, err = n.authorizeJob(e.Author, j)
	}
	if err != nil {
		return jobs.Result{Error: err.Error()}
	}
	ctx, cancel := context.WithTimeout(n.ctx, cmp.Or(j.Timeout, plugins.DefaultTimeout))
	defer cancel()
	out, err := inst.Invoke(ctx, j.Method, j.Args)
	if err != nil {
		return jobs.Result{Output: out, Error: err.Error()}
	}
	return jobs.Result{OK: true, Output: out}
}

// authorizeJob finds the instance job j runs on, as a call from its
// writer would be authorised: the plugin loaded in a tribe of the job
// this node is a member of, or, for a job sent to named nodes only, any
// tribe that loaded it. A tribe job never falls back to another tribe's
// plugin: its writer loaded the plugin for its tribes, not for others.
func (n *Node) authorizeJob(writer peer.ID, j *jobs.Job) (*plugins.Instance, error) {
	var tribes []string
	for _, t := range j.Tribes {
		if n.isMember(t, n.host.ID()) {
			tribes = append(tribes, t)
		}
	}
	if len(j.Tribes) == 0 {
		tribes = append(tribes, "")
	}
	if len(tribes) == 0 {
		return nil, plugins.Errorf(plugins.CodeNotLoaded, "this node is not a member of a tribe of the job (%s)", strings.Join(j.Tribes, ", "))
	}
	var inst *plugins.Instance
	var err error
	for _, t := range tribes {
		if inst, err = n.Authorize(writer, plugins.Request{Tribe: t, Plugin: j.Plugin, Method: j.Method}); err == nil {
			return inst, nil
		}
	}
	return nil, err
}

func (n *Node) jobDir() string { return filepath.Join(n.cfg.DataDir, "jobs") }

func (n *Node) jobOutputPath(id string) string { return filepath.Join(n.jobDir(), id+".out") }

// saveJobOutput keeps a run's whole output, written in full before the
// ack that names its digest.
func (n *Node) saveJobOutput(id string, out []byte) error {
	if err := os.MkdirAll(n.jobDir(), 0o700); err != nil {
		return err
	}
	tmp := n.jobOutputPath(id) + ".tmp"
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, n.jobOutputPath(id))
}

// collectJobs deletes, on a trusted writer, the jobs finished longer than
// the retention ago; and on every node, the acks it holds (and the outputs
// it kept) of jobs that are gone. From the same summaries, a writer
// follows again the jobs it wrote that are not finished (jobacks.go).
func (n *Node) collectJobs() {
	now := n.now()
	self := n.host.ID()
	mayDelete := n.replica.Trust().Authorize(jobKey("x"), self) == nil
	live, unfinished := map[string]bool{}, map[string]bool{}
	for _, e := range n.replica.Children(jobsPrefix) { // the jobs, not their acks
		j, author, err := n.job(e)
		if err != nil {
			continue
		}
		live[j.ID] = true
		if !mayDelete {
			continue
		}
		s := n.jobStanding(e, j) // kept while neither the job nor its acks change
		if author == self && s.State == jobs.Pending {
			unfinished[e.Key] = true
		}
		if now.After(jobs.CollectAt(j, s, n.cfg.JobRetention)) {
			if _, err := n.replica.Delete(n.ctx, e.Key); err != nil && n.ctx.Err() == nil {
				n.log.Warn("collecting a finished job", "job", j.ID, "err", err)
			}
			delete(live, j.ID)
		}
	}
	if err := n.replica.Forget(n.goneAcks(live)...); err != nil && n.ctx.Err() == nil {
		n.log.Warn("collecting the acks of jobs that are gone", "err", err)
	}
	n.jobs.fetches.follow(unfinished)
	n.jobs.recall.prune(live)
	n.jobs.pruneViews(live)
	n.jobs.mu.Lock()
	for key := range n.jobs.cache {
		if !live[strings.TrimPrefix(key, jobsPrefix)] {
			delete(n.jobs.cache, key)
		}
	}
	for id := range n.jobs.acks {
		if !live[id] {
			delete(n.jobs.acks, id)
		}
	}
	n.jobs.mu.Unlock()
	files, _ := os.ReadDir(n.jobDir())
	for _, f := range files {
		// A .out.tmp is what a crash between saveJobOutput's write and
		// its rename leaves: gone with its job, as the .out is (not
		// sooner: a run of a live job may be writing it now).
		name := strings.TrimSuffix(f.Name(), ".tmp")
		if id, ok := strings.CutSuffix(name, ".out"); ok && !live[id] {
			os.Remove(filepath.Join(n.jobDir(), f.Name()))
		}
	}
}

// initJobs sets what the job code reads: this node's peer ID as ack keys
// spell it, and the node records indexed by target hash, kept current. It
// runs in New, before the node talks to anyone.
func (n *Node) initJobs() {
	s := &n.jobs
	s.self = n.host.ID().String()
	s.targets = map[[8]byte]string{}
	index := func(c gossip.Change) {
		id := strings.TrimPrefix(c.Key, nodesPrefix)
		s.mu.Lock()
		defer s.mu.Unlock()
		if c.New == nil || c.New.Deleted {
			delete(s.targets, jobs.TargetHash(id))
			return
		}
		s.targets[jobs.TargetHash(id)] = id
	}
	n.replica.Watch(nodesPrefix, index)
	for _, e := range n.replica.Prefix(nodesPrefix) {
		index(gossip.Change{Key: e.Key, New: e})
	}
	n.replica.Watch(jobsPrefix, func(c gossip.Change) { s.dropView(c.Key) })
}

// targetByHash is the peer ID of a node record whose target hash is h.
func (n *Node) targetByHash(h [8]byte) (string, bool) {
	n.jobs.mu.Lock()
	defer n.jobs.mu.Unlock()
	id, ok := n.jobs.targets[h]
	return id, ok
}

// targetByHex is targetByHash for a hash as a job's status writes it
// (jobs.Target.Hash).
func (n *Node) targetByHex(h string) (string, bool) {
	var b [8]byte
	if hex.DecodedLen(len(h)) != len(b) {
		return "", false
	}
	if _, err := hex.Decode(b[:], []byte(h)); err != nil {
		return "", false
	}
	return n.targetByHash(b)
}

// summarize is a job across its targets, as this node knows it.
func (n *Node) summarize(j *jobs.Job) jobs.Summary {
	s, _ := n.summarizeSized(j)
	return s
}

// summarizeSized is summarize plus the bytes of the job's acks, signed,
// as the state holds them (one pass over them for both).
func (n *Node) summarizeSized(j *jobs.Job) (jobs.Summary, int) {
	acks, size := n.jobAcks(j)
	return jobs.Summarize(j, acks, n.targetByHash, n.now()), size
}

// jobAcks are the readable acks of job j held here that count (ackCounts),
// by the acking peer's ID, and the bytes of all its acks, signed.
func (n *Node) jobAcks(j *jobs.Job) (map[string]jobs.Ack, int) {
	acks := map[string]jobs.Ack{}
	size := 0
	for _, e := range n.replica.Prefix(jobKey(j.ID) + "/acks/") {
		size += len(e.Raw)
		by := e.Key[strings.LastIndexByte(e.Key, '/')+1:]
		if !n.heldAckCounts(j, by) {
			continue
		}
		if a, err := jobs.DecodeAck(e.Value); err == nil {
			acks[by] = a
		}
	}
	return acks, size
}

// readAck sets acks' entry for ack key of job j from the state: the ack
// held there if it counts, or none. It returns the acking peer's ID.
func (n *Node) readAck(j *jobs.Job, acks map[string]jobs.Ack, key string) string {
	peer := key[strings.LastIndexByte(key, '/')+1:]
	e, ok := n.replica.Get(key)
	if !ok || !n.heldAckCounts(j, peer) {
		delete(acks, peer)
		return peer
	}
	a, err := jobs.DecodeAck(e.Value)
	if err != nil {
		delete(acks, peer)
		return peer
	}
	acks[peer] = a
	return peer
}

// errAckRefused is an ack admitAck does not take.
var errAckRefused = errors.New("ack refused")

// admitAck is the replica's Admit (gossip.ReplicaConfig.Admit): an ack
// is taken only of a job held here (or handed and not stored yet) that
// it counts for (ackCounts). The authorisation table checks only that
// the ack's author is the peer its key names, so any peer that could
// connect could turn a done job failed, hold one pending with a running
// ack, or fill the writers' state with acks of jobs that do not exist.
// An ack that comes before its job is refused too, not kept aside: a
// target hands its ack to the job's writer, which holds the job; the
// writers share acks by anti-entropy, which brings a refused one again
// once its job is here (a pull that brings both takes both); and a node
// asked about a job pulls the job before it fetches the acks.
func (n *Node) admitAck(e *gossip.Signed, held func(string) (*gossip.Signed, bool)) error {
	rest, ok := strings.CutPrefix(e.Key, jobsPrefix)
	if !ok {
		return nil
	}
	id, by, ok := strings.Cut(rest, "/acks/")
	if !ok {
		return nil // the job itself
	}
	je, ok := held(jobKey(id))
	if !ok {
		je, ok = n.jobs.handedEntry(jobKey(id))
	}
	var err error
	switch {
	case !ok:
		err = fmt.Errorf("%w: %s: no such job here", errAckRefused, e.Key)
	default:
		j, _, jerr := n.job(je)
		switch {
		case jerr != nil:
			err = fmt.Errorf("%w: %s: %w", errAckRefused, e.Key, jerr)
		case !n.ackCountsIn(je, j, by):
			err = fmt.Errorf("%w: %s: %s is not a target of the job", errAckRefused, e.Key, by)
		}
	}
	if err != nil {
		n.jobs.ackRefused.Add(1)
	}
	return err
}

// ackCounts reports whether an ack of job j by peer id counts: the ack of
// one of its targets, or, for a job that takes new members, of a member
// of one of its tribes whose membership counts (admitted, or by hand).
// Anyone else's is nobody's business: it neither changes the job's state
// nor keeps it pending.
func (n *Node) ackCounts(j *jobs.Job, id string) bool {
	if e, ok := n.replica.Get(jobKey(j.ID)); ok {
		if cur, _, err := n.job(e); err == nil && cur == j {
			return n.ackCountsIn(e, j, id)
		}
	}
	return j.Targeted(id) || n.newMemberOf(j, id)
}

// heldAckCounts reports whether an ack of job j by peer id held here
// counts: as ackCounts, or, for a job that takes new members, whatever
// tribes id is in now. Held, the ack was taken while it counted
// (admitAck): its author was a member then, and ran the job or said why
// not. Counted by membership now, a new member that failed the job and
// then left its tribe (or stopped matching its policy) turned the job
// done.
func (n *Node) heldAckCounts(j *jobs.Job, id string) bool {
	return j.IncludeNew || n.ackCounts(j, id)
}

// ackCountsIn is ackCounts for j read from entry e.
func (n *Node) ackCountsIn(e *gossip.Signed, j *jobs.Job, id string) bool {
	return n.isTarget(e, j, id) || n.newMemberOf(j, id)
}

// newMemberOf reports whether id is a member of a tribe of j, which takes
// new members, whose membership counts here.
func (n *Node) newMemberOf(j *jobs.Job, id string) bool {
	if !j.IncludeNew {
		return false
	}
	p, err := peer.Decode(id)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(j.Tribes, func(t string) bool { return n.isMember(t, p) })
}

// isTarget reports whether id is in the target set of job j, read from
// e, from a set made once per version of the job: Targeted reads the
// whole set, 5,000 targets for each of 5,000 acks.
func (n *Node) isTarget(e *gossip.Signed, j *jobs.Job, id string) bool {
	s := &n.jobs
	s.mu.Lock()
	c, ok := s.cache[e.Key]
	if !ok || c.hash != e.Hash || c.job != j {
		s.mu.Unlock()
		return j.Targeted(id)
	}
	if c.targets == nil {
		c.targets = make(map[[8]byte]bool, j.NumTargets())
		for i := 0; i+8 <= len(j.Targets); i += 8 {
			c.targets[[8]byte(j.Targets[i:i+8])] = true
		}
		s.cache[e.Key] = c
	}
	targets := c.targets
	s.mu.Unlock()
	return targets[jobs.TargetHash(id)]
}
