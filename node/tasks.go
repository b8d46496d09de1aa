package node

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/plugins/tasks"
)

// Tasks (plugins/tasks holds the manifest, the schedule math and the
// workflow): a trusted writer writes tribes/<t>/tasks/<name>; every node
// whose membership of t counts runs it on its schedule with the plugins it
// loaded for t, and reports how it goes in its own record, at most once per
// taskReportEvery.

// taskRecord is tribes/<t>/tasks/<name>.
type taskRecord struct {
	Manifest json.RawMessage `json:"manifest"` // tasks.Manifest, canonical JSON
	Created  time.Time       `json:"created"`  // the interval's anchor
	Stopped  bool            `json:"stopped,omitempty"`
}

func taskKey(tribe, name string) string { return tribesPrefix + tribe + "/tasks/" + name }

// taskReportEvery is the least time between two writes of this node's
// record for task statuses: each write is a signed entry every node
// receives, so a task run every second must not cost a write each.
const taskReportEvery = 5 * time.Second

// taskSet is the tasks this node runs, by "<tribe>/<name>".
type taskSet struct {
	mu      sync.Mutex
	running map[string]*taskRun
	status  map[string]tasks.Status
	dirty   bool // status changed since the record was last written
	// dirtied has a token once dirty was set since the task loop last
	// looked: the loop arms its report timer only then.
	dirtied chan struct{}

	watch        taskWatch // taskwatch.go
	watchRefused atomic.Int64
	// watchOverlong counts members' run lines over taskRunLineMax, and
	// watchMalformed those that do not read.
	watchOverlong, watchMalformed atomic.Int64
}

type taskRun struct {
	raw    []byte // the entry's value it runs
	cancel context.CancelFunc
	done   chan struct{}
}

// report takes run r's status of key, unless r no longer runs it.
func (s *taskSet) report(key string, r *taskRun, st tasks.Status) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running[key] != r {
		return
	}
	s.status[key] = st
	s.markDirty()
}

// markDirty notes that the record's task statuses changed. Callers hold
// s.mu.
func (s *taskSet) markDirty() {
	s.dirty = true
	select {
	case s.dirtied <- struct{}{}:
	default:
	}
}

// statuses is a copy for the node record (nil when it runs none).
func (s *taskSet) statuses() map[string]tasks.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.status) == 0 {
		return nil
	}
	out := make(map[string]tasks.Status, len(s.status))
	for k, v := range s.status {
		out[k] = v
	}
	return out
}

// taskLoop starts and stops task runs as the entries and this node's
// memberships change, and writes the statuses into the record.
func (n *Node) taskLoop() {
	trigger := make(chan struct{}, 1)
	poke := func(gossip.Change) {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	self := "/members/" + n.host.ID().String() + "/"
	defer n.replica.Watch(tribesPrefix, func(c gossip.Change) {
		if strings.Contains(c.Key, "/tasks/") || strings.Contains(c.Key, self) {
			poke(c)
		}
	})()
	defer n.replica.Watch(policiesPrefix, poke)()
	defer n.replica.Watch(nodesPrefix+n.host.ID().String(), poke)()
	defer n.stopTasks()
	poke(gossip.Change{})
	// The report timer runs only while a report is due (a ticker woke
	// every agent every taskReportEvery, tasks or not); a change after a
	// quiet spell is written at once, the next ones taskReportEvery apart.
	var report <-chan time.Time
	var last time.Time
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-trigger:
			n.syncTasks()
		case <-n.tasks.dirtied:
			if report == nil {
				report = time.After(max(0, taskReportEvery-time.Since(last)))
			}
		case <-report:
			report, last = nil, time.Now()
			n.tasks.mu.Lock()
			dirty := n.tasks.dirty
			n.tasks.dirty = false
			n.tasks.mu.Unlock()
			if dirty {
				if err := n.publishSelf(n.ctx); err != nil && n.ctx.Err() == nil {
					n.log.Warn("publishing task states", "err", err)
				}
			}
		}
	}
}

// syncTasks runs what the state asks of this node and stops the rest.
func (n *Node) syncTasks() {
	member, entries := n.ownTribesAnd("tasks")
	want := map[string][]byte{}
	for _, e := range entries {
		segs := strings.Split(e.Key, "/")
		if member[segs[1]] {
			want[segs[1]+"/"+segs[3]] = e.Value
		}
	}
	s := &n.tasks
	// Runs to stop are waited for without the lock: they report under it.
	s.mu.Lock()
	var stop []*taskRun
	for key, r := range s.running {
		if raw, ok := want[key]; !ok || !bytes.Equal(raw, r.raw) {
			stop = append(stop, r)
			delete(s.running, key)
		}
	}
	for key := range s.status { // tasks gone, or of tribes left (even while down)
		if _, ok := want[key]; !ok {
			delete(s.status, key)
			s.markDirty()
		}
	}
	s.mu.Unlock()
	for _, r := range stop {
		r.cancel()
		<-r.done
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, raw := range want {
		if s.running[key] != nil {
			continue
		}
		tribe, _, _ := strings.Cut(key, "/")
		ctx, cancel := context.WithCancel(n.ctx)
		r := &taskRun{raw: raw, cancel: cancel, done: make(chan struct{})}
		s.running[key] = r
		st := s.status[key]
		n.spawn(func() {
			defer close(r.done)
			n.runTask(ctx, tribe, key, r, st)
		})
	}
}

// restoreTasks takes up the task statuses this node's own record held
// when it last stopped, before anything rewrites that record: a task's
// runs count on across a restart (one with count: 1 does not run again)
// and a disabled one stays disabled. What the record did not hold yet
// (statuses are written at most taskReportEvery apart, a counted task's
// last run at once) is lost with a crash: those runs may be made again.
func (n *Node) restoreTasks() {
	e, ok := n.replica.Get(nodesPrefix + n.host.ID().String())
	if !ok || e.Author != n.host.ID() {
		return
	}
	var rec struct {
		Tasks map[string]tasks.Status `json:"tasks"`
	}
	if err := json.Unmarshal(e.Value, &rec); err != nil {
		return
	}
	s := &n.tasks
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, st := range rec.Tasks {
		if _, ok := s.status[k]; !ok {
			s.status[k] = st
		}
	}
}

func (n *Node) stopTasks() {
	s := &n.tasks
	s.mu.Lock()
	runs := s.running
	s.running = map[string]*taskRun{}
	s.mu.Unlock()
	for _, r := range runs {
		r.cancel()
		<-r.done
	}
}

// runTask runs one task on its schedule until ctx ends, the schedule has
// no more runs, or max_failures disables it. st is what this node
// reported of it before (its runs count on across a stop and a start).
// A disabled task runs again only when its entry changes.
func (n *Node) runTask(ctx context.Context, tribe, key string, r *taskRun, st tasks.Status) {
	var rec taskRecord
	var m tasks.Manifest
	err := json.Unmarshal(r.raw, &rec)
	if err == nil {
		m, err = tasks.Decode(rec.Manifest)
	}
	if err != nil { // a trusted writer's entry this version cannot run
		st.State, st.Error = "error", "unreadable task entry: "+err.Error()
		n.tasks.report(key, r, st)
		return
	}
	sum := sha256.Sum256(r.raw)
	entry := hex.EncodeToString(sum[:6])
	switch {
	case !st.Task.IsZero() && !st.Task.Equal(rec.Created):
		st = tasks.Status{} // another task of that name: its own runs
	case st.State == tasks.Disabled && st.Entry == entry:
		// Disabled under this very entry before this node restarted.
		n.tasks.report(key, r, st)
		return
	}
	st.Task, st.Entry = rec.Created, entry
	if rec.Stopped {
		st.State = tasks.Stopped
		n.tasks.report(key, r, st)
		return
	}
	if st.State == tasks.Disabled { // a new entry (tribe task start) gives it another go
		st.Failures = 0
	}
	st.State = tasks.Running
	n.tasks.report(key, r, st)
	offset := tasks.SplayOffset(m.Schedule.Splay, n.host.ID().String(), key)
	caller := taskCaller{n: n, tribe: tribe}
	for {
		next, ok := m.Schedule.Next(n.now(), rec.Created, st.Runs, offset)
		if !ok {
			st.State = tasks.Done
			n.tasks.report(key, r, st)
			if m.Schedule.Count > 0 && st.Runs > 0 {
				// Its runs are done: written now, not up to
				// taskReportEvery later, so that a restart in
				// between does not run it again (restoreTasks).
				if err := n.publishSelf(ctx); err != nil && ctx.Err() == nil {
					n.log.Warn("publishing task states", "err", err)
				}
			}
			return
		}
		t := time.NewTimer(next.Sub(n.now()))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		start := n.now()
		runCtx, cancel := context.WithTimeout(ctx, plugins.DefaultTimeout)
		out, err := m.Workflow.Run(runCtx, caller)
		cancel()
		if ctx.Err() != nil {
			return // stopped mid-run: not a failure of the task
		}
		st.Record(n.now(), n.now().Sub(start), err, m.MaxFailures)
		n.tasks.report(key, r, st)
		n.tasks.watch.emit(key, n.runEvent(tribe, m.Name, st, out, err))
		if st.State == tasks.Disabled {
			n.log.Warn("task disabled on this node", "task", key, "err", st.Error)
			return
		}
	}
}

// taskCaller makes a task's steps' calls: a plugin this node loaded for
// the task's tribe, or for a publish step naming another tribe, one
// member of that tribe.
type taskCaller struct {
	n     *Node
	tribe string
}

func (c taskCaller) Call(ctx context.Context, s tasks.Step, in json.RawMessage) (json.RawMessage, error) {
	if s.Tribe != "" {
		return c.n.publishRemote(ctx, s, in)
	}
	c.n.plugins.mu.Lock()
	lp := c.n.plugins.loaded[c.tribe+"/"+s.Plugin]
	c.n.plugins.mu.Unlock()
	if lp == nil || lp.inst == nil {
		return nil, fmt.Errorf("plugin %s is not loaded here in tribe %s", s.Plugin, c.tribe)
	}
	return lp.inst.Invoke(ctx, s.Method, in)
}

// publishRemote sends a publish step's input to one member of s.Tribe:
// the members in an order that is a stable function of this node (so the
// senders spread over the members), the next one if a call fails.
func (n *Node) publishRemote(ctx context.Context, s tasks.Step, in json.RawMessage) (json.RawMessage, error) {
	targets, err := n.callTargets(api.CallRequest{Tribes: []string{s.Tribe}})
	if err != nil {
		return nil, err
	}
	self := n.host.ID().String()
	rank := func(id peer.ID) uint64 {
		h := fnv.New64a()
		h.Write([]byte(self))
		h.Write([]byte(id))
		return h.Sum64()
	}
	slices.SortFunc(targets, func(a, b callTarget) int { return cmp.Compare(rank(b.id), rank(a.id)) })
	var errs []error
	for _, t := range targets {
		r := n.callOne(ctx, t, plugins.Request{ID: n.callID(), Tribe: s.Tribe, Plugin: s.Plugin, Method: s.Method, Args: in})
		if r.OK {
			return r.Result, nil
		}
		errs = append(errs, fmt.Errorf("%s: %s", cmp.Or(t.name, t.id.String()), r.Error))
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("tribe %s has no members to publish to", s.Tribe)
	}
	return nil, fmt.Errorf("no member of %s took it: %w", s.Tribe, errors.Join(errs...))
}
