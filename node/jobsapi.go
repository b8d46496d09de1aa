package node

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/plugins/jobs"
)

// ErrUnknownJob is returned for a job id that is not in the state.
var ErrUnknownJob = errors.New("unknown job")

// newJobID is sortable by submission time, and says when it was made
// (jobs.IDTime).
func (n *Node) newJobID() string {
	var b [4]byte
	rand.Read(b[:])
	return jobs.NewID(n.now(), b)
}

// SubmitJob implements api.Agent. The request is checked where it is
// typed: the plugin is one this agent knows and is loaded in every named
// tribe, the targets exist and count, the limits hold. The targets are
// fixed now: the members of each tribe that count, and each named node.
func (n *Node) SubmitJob(ctx context.Context, req api.JobRequest) (api.Job, error) {
	if err := (plugins.Request{Plugin: req.Plugin, Method: req.Method}).Check(); err != nil {
		return api.Job{}, api.BadRequest(errors.New(strings.TrimPrefix(err.Error(), "plugins: ")))
	}
	if len(req.Args) > 0 && !json.Valid(req.Args) {
		return api.Job{}, api.BadRequest(errors.New("the arguments are not valid JSON"))
	}
	expires := req.Expires
	if expires == 0 {
		expires = jobs.DefaultExpiry
	}
	switch {
	case len(req.Tribes)+len(req.Nodes) == 0:
		return api.Job{}, api.BadRequest(errors.New("name the targets: --tribe T or --node N, at least one"))
	case req.IncludeNew && len(req.Tribes) == 0:
		return api.Job{}, api.BadRequest(errors.New("--include-new takes the new members of a --tribe: name one"))
	case expires < time.Second || expires > jobs.MaxExpiry:
		return api.Job{}, api.BadRequest(fmt.Errorf("expiry %v: from 1s to %v", req.Expires, jobs.MaxExpiry))
	case req.Retries < 0 || req.Retries > jobs.MaxRetries:
		return api.Job{}, api.BadRequest(fmt.Errorf("retries %d: from 0 to %d", req.Retries, jobs.MaxRetries))
	case req.Timeout < 0 || req.Timeout > plugins.MaxTimeout:
		return api.Job{}, api.BadRequest(fmt.Errorf("timeout %v: from 1ms to %v", req.Timeout, plugins.MaxTimeout))
	case len(req.Args) > jobs.MaxArgs:
		return api.Job{}, api.BadRequest(fmt.Errorf("arguments of %d bytes: a job carries at most %d", len(req.Args), jobs.MaxArgs))
	}
	if err := n.replica.Trust().Authorize(jobKey("x"), n.host.ID()); err != nil {
		return api.Job{}, writeErr(err)
	}
	all := n.tribes()
	var targets []string
	var errs []error
	for _, t := range req.Tribes {
		v, ok := all[t]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%w %q (see `tribe list`)", ErrUnknownTribe, t))
			continue
		case !slices.Contains(v.plugins, req.Plugin):
			errs = append(errs, fmt.Errorf("plugin %s is not loaded in tribe %s (tribe plugin load %s --tribe %s)", req.Plugin, t, req.Plugin, t))
			continue
		}
		ids := n.tribeMembers(t)
		if len(ids) == 0 && !req.IncludeNew {
			errs = append(errs, fmt.Errorf("tribe %q has no members (--include-new reaches those who join before the job expires)", t))
		}
		for _, id := range ids {
			targets = append(targets, id.String())
		}
	}
	if len(req.Nodes) > 0 {
		ids, err := n.resolve(req.Nodes)
		if err != nil {
			return api.Job{}, err
		}
		rules := n.rules()
		for _, id := range ids {
			if !rules.Counts(id) {
				errs = append(errs, fmt.Errorf("node %s is %s: it can be sent jobs once a trusted writer admits it (tribe admit)", id, rules.Status(id)))
			}
			targets = append(targets, id.String())
		}
	}
	if err := errors.Join(errs...); err != nil {
		return api.Job{}, api.BadRequest(err)
	}
	now := n.now().UTC()
	j := jobs.Job{ID: n.newJobID(), Tribes: req.Tribes, Plugin: req.Plugin, Method: req.Method, Args: req.Args,
		IncludeNew: req.IncludeNew, Parallel: req.Parallel, Created: now, Expires: now.Add(expires),
		Retries: req.Retries, Timeout: req.Timeout}
	j.SetTargets(targets)
	if j.NumTargets() > jobs.MaxTargets {
		return api.Job{}, api.BadRequest(fmt.Errorf("%d targets: a job reaches at most %d; submit several", j.NumTargets(), jobs.MaxTargets))
	}
	// Its place in the queue: after the last job of the queue known here.
	var last *jobs.Job
	for _, o := range n.knownJobs() {
		if o.Queue() == j.Queue() && (last == nil || o.Seq > last.Seq || (o.Seq == last.Seq && o.Created.After(last.Created))) {
			last = o
		}
	}
	if last != nil {
		j.After, j.Seq = last.ID, last.Seq+1
	}
	if err := j.Check(); err != nil {
		return api.Job{}, api.BadRequest(err)
	}
	b, _ := json.Marshal(j)
	e, err := n.replica.PutQuiet(ctx, jobKey(j.ID), b)
	if err != nil {
		return api.Job{}, writeErr(err)
	}
	// Published too where the targets alone will not do: new members
	// must find it, and with no trust list any node may have written a
	// job, so a node that does not know one has no writer to ask.
	publish := j.IncludeNew || n.replica.Trust().Open()
	n.spawn(func() { n.deliverJob(e, targets, publish) })
	return n.jobView(&j, false), nil
}

// jobByID is the live job id, or a 404. A job this node does not hold
// may be one it was not sent: it asks the trusted writers first.
func (n *Node) jobByID(ctx context.Context, id string) (*jobs.Job, *gossip.Signed, error) {
	if !gossip.ValidName(id) {
		return nil, nil, api.BadRequest(fmt.Errorf("%q is not a job id", id))
	}
	e, ok := n.replica.Get(jobKey(id))
	var unreached error
	if !ok {
		writers := n.replica.Trust().Peers()
		n.syncJobWriters(ctx, writers...)
		if e, ok = n.replica.Get(jobKey(id)); !ok {
			// Those this node is not connected to, dialled.
			var far []peer.ID
			for _, w := range writers {
				if w != n.host.ID() && !n.isConnected(w) {
					far = append(far, w)
				}
			}
			unreached = n.reachWriters(ctx, far...)
			n.syncJobWriters(ctx, far...)
			e, ok = n.replica.Get(jobKey(id))
		}
	}
	if !ok {
		err := fmt.Errorf("%w %q (see `tribe job list`)", ErrUnknownJob, id)
		if unreached != nil {
			err = fmt.Errorf("%w; a trusted writer, which would know it, %w", err, unreached)
		}
		return nil, nil, api.NotFound(err)
	}
	j, _, err := n.job(e)
	if err != nil {
		return nil, nil, fmt.Errorf("job %s: %w", id, err)
	}
	return j, e, nil
}

// Job implements api.Agent.
func (n *Node) Job(ctx context.Context, id string) (api.Job, error) {
	j, _, err := n.jobByID(ctx, id)
	if err != nil {
		return api.Job{}, err
	}
	behind := n.askJobWriter(ctx, j)
	v := n.jobView(j, true)
	if behind != nil && v.State == string(jobs.Pending) {
		v.Behind = behind.Error()
	}
	return v, nil
}

// Jobs implements api.Agent: every job (of tribe only, if set), oldest
// first, with counts instead of rows.
func (n *Node) Jobs(ctx context.Context, tribe string) ([]api.Job, error) {
	// Jobs reach their targets, not every node: the trusted writers know
	// them all, and hold their targets' acks. A node that does not asks
	// one for its list (joblist.go); with writers of an earlier version
	// it pulls everything from them, acks included, as it did; with no
	// writer connected it lists what it holds.
	if !n.holdsAllAcks() {
		list, err := n.askJobList(ctx, tribe)
		switch {
		case err == nil:
			return list, nil
		case errors.Is(err, errNoWriter):
			return n.localJobs(tribe), nil
		case !errors.Is(err, errListUnsupported):
			return nil, err
		}
	}
	n.syncJobWritersIn(ctx, gossip.Full, n.replica.Trust().Peers()...)
	return n.localJobs(tribe), nil
}

// CancelJob implements api.Agent: the job is written again, cancelled;
// targets that have not started it end it cancelled, a run under way
// finishes.
func (n *Node) CancelJob(ctx context.Context, id string) (api.Job, error) {
	j, _, err := n.jobByID(ctx, id)
	if err != nil {
		return api.Job{}, err
	}
	n.askJobWriter(ctx, j)
	if s := n.summarize(j); s.State != jobs.Pending {
		return api.Job{}, api.BadRequest(fmt.Errorf("job %s has ended (%s): nothing to cancel", id, s.State))
	}
	if j.Cancelled {
		return n.jobView(j, true), nil
	}
	c := *j
	c.Cancelled = true
	b, _ := json.Marshal(c)
	if _, err := n.replica.Put(ctx, jobKey(id), b); err != nil {
		return api.Job{}, writeErr(err)
	}
	return n.jobView(&c, true), nil
}

// jobView is a job as the API shows it.
func (n *Node) jobView(j *jobs.Job, rows bool) api.Job {
	v, _ := n.summarizedView(j, rows)
	return v
}

// summarizedView is jobView and the summary it was made from.
func (n *Node) summarizedView(j *jobs.Job, rows bool) (api.Job, jobs.Summary) {
	s, ackBytes := n.summarizeSized(j)
	v := api.Job{ID: j.ID, State: string(s.State), Tribes: j.Tribes, Plugin: j.Plugin, Method: j.Method, Args: j.Args,
		Created: j.Created, Expires: j.Expires, Retries: j.Retries, IncludeNew: j.IncludeNew, Parallel: j.Parallel,
		Cancelled: j.Cancelled, Counts: map[string]int{}, StateBytes: ackBytes}
	if e, ok := n.replica.Get(jobKey(j.ID)); ok {
		v.StateBytes += len(e.Raw)
	}
	for _, t := range s.Targets {
		v.Counts[string(t.Ack.State)]++
		if rows {
			v.Targets = append(v.Targets, n.targetView(j.ID, t))
		}
	}
	return v, s
}

func (n *Node) targetView(job string, t jobs.Target) api.JobTarget {
	row := api.JobTarget{Job: job, ID: t.ID, State: string(t.Ack.State), OK: t.Ack.OK, Attempts: t.Ack.Attempts,
		Error: t.Ack.Error, OutputHead: t.Ack.OutputHead, OutputBytes: t.Ack.OutputBytes, OutputDigest: t.Ack.OutputDigest}
	if !t.Ack.Started.IsZero() && !t.Ack.Ended.IsZero() {
		row.MS = t.Ack.Ended.Sub(t.Ack.Started).Milliseconds()
	}
	if t.ID == "" {
		row.Name = "unknown node " + t.Hash
		return row
	}
	if id, err := peer.Decode(t.ID); err == nil {
		rec, _ := n.nodeNamed(id)
		row.Name = rec.Name
	}
	return row
}

// WaitJob implements api.Agent: each target's final state as this node
// learns it (the ones already final first), until none is pending.
func (n *Node) WaitJob(ctx context.Context, id string, emit func(*api.JobTarget)) error {
	wj, _, err := n.jobByID(ctx, id)
	if err != nil {
		return err
	}
	n.askJobWriter(ctx, wj)
	// Each ack is decoded once a version, as it changes, and taken alone
	// (jobs.Progress); the job is summarized whole only at the start, when
	// its acks say it has ended, when the job itself changes, and past
	// its expiry (which comes with no entry). Summarized at every change, a
	// job to N targets cost its writer N² decodes (most of a waiting
	// writer's CPU at 25), then N summaries of N targets: 16 ms of CPU an
	// ack at 5,000 (BenchmarkJobWaitPerAck).
	changed := make(chan struct{}, 1)
	acksOf := jobKey(id) + "/acks/"
	var mu sync.Mutex
	dirty := map[string]bool{}
	defer n.replica.Watch(jobKey(id), func(c gossip.Change) {
		if strings.HasPrefix(c.Key, acksOf) {
			mu.Lock()
			dirty[c.Key] = true
			mu.Unlock()
		}
		select {
		case changed <- struct{}{}:
		default:
		}
	})()
	acks, _ := n.jobAcks(wj) // after the watch: a change between is dirty
	emit(nil)
	sent := map[string]bool{}
	var (
		j         *jobs.Job
		progress  *jobs.Progress
		summarize bool
		finished  []string
	)
	tick := time.NewTicker(time.Second) // expiry comes with no entry
	defer tick.Stop()
	for {
		e, ok := n.replica.Get(jobKey(id))
		if !ok {
			return fmt.Errorf("job %s was deleted", id)
		}
		cur, _, err := n.job(e)
		if err != nil {
			return err
		}
		if cur != j { // the first time, or the job changed (cancelled)
			j, progress, summarize = cur, jobs.NewProgress(cur), true
			for peer, a := range acks {
				progress.Set(peer, a, true)
			}
		}
		mu.Lock()
		keys := dirty
		dirty = map[string]bool{}
		mu.Unlock()
		finished = finished[:0]
		for k := range keys {
			peer := n.readAck(j, acks, k)
			a, held := acks[peer]
			progress.Set(peer, a, held)
			if held && a.State.Final() && !sent[peer] {
				finished = append(finished, peer)
			}
		}
		if summarize || !progress.Pending() {
			summarize = false
			s := jobs.Summarize(j, acks, n.targetByHash, n.now())
			for _, t := range s.Targets {
				if key := t.ID + t.Hash; t.Ack.State.Final() && !sent[key] {
					sent[key] = true
					row := n.targetView(id, t)
					emit(&row)
				}
			}
			if s.State != jobs.Pending {
				return nil
			}
		} else {
			slices.Sort(finished)
			for _, peer := range finished {
				sent[peer] = true
				row := n.targetView(id, jobs.Target{ID: peer, Ack: acks[peer]})
				emit(&row)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-n.ctx.Done():
			return errors.New("the agent is shutting down")
		case <-changed:
		case <-tick.C:
			summarize = !n.now().Before(j.Expires)
			n.askJobWriter(ctx, j) // acks go to the writer, not here
		}
	}
}
