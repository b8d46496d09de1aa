package node

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/gossip/authority"
	"github.com/tribeagent/tribe/internal/strictjson"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins/tasks"
)

// `tribe task watch`: the watching agent opens a stream of
// TaskWatchProtocol to every member of the task's tribe, and each member
// writes a line for every run of the task as it ends, until the stream
// closes. Nothing is sent while nobody watches.

// TaskWatchProtocol streams a task's runs from a member.
const TaskWatchProtocol = "/tribe/task-watch/1.0.0"

const (
	// maxTaskWatchers bounds the watch streams a member serves at once;
	// maxTaskWatchesPerPeer what one peer may hold of them: one stream a
	// task for every watch on that node (a dashboard following 16 tasks),
	// and four peers still leave room for the rest.
	maxTaskWatchers       = 64
	maxTaskWatchesPerPeer = 16
	// taskWatchBuffer is how many runs a slow watcher may fall behind
	// before runs are dropped for it (counted as task_watch_dropped).
	taskWatchBuffer = 16
	// maxOutputHead is how much of a run's output a watcher gets.
	maxOutputHead = 1 << 10
	// taskWatchRequestMax bounds the request line.
	taskWatchRequestMax = 1 << 10
	// taskRunLineMax bounds a run line a watching agent reads: the output
	// and error heads are 1 KiB each, at most 6 KiB each once escaped.
	taskRunLineMax = 16 << 10
)

// taskWatch is the watchers of this member's task runs.
type taskWatch struct {
	mu      sync.Mutex
	byTask  map[string]map[chan api.TaskRun]bool
	n       int             // the network's watches, local ones not counted
	perPeer map[peer.ID]int // the network's watches by peer
	dropped int64
}

// add registers a watcher of key from peer p ("" for this node's own API,
// which the network's caps do not bind: strangers cannot lock the
// operator out), or fails when too many watch.
func (w *taskWatch) add(key string, p peer.ID) (chan api.TaskRun, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p != "" {
		if w.n >= maxTaskWatchers {
			return nil, fmt.Errorf("this node serves %d task watchers already", maxTaskWatchers)
		}
		if w.perPeer[p] >= maxTaskWatchesPerPeer {
			return nil, fmt.Errorf("this node serves %d task watches of %s already", maxTaskWatchesPerPeer, p)
		}
		if w.perPeer == nil {
			w.perPeer = map[peer.ID]int{}
		}
		w.perPeer[p]++
		w.n++
	}
	if w.byTask == nil {
		w.byTask = map[string]map[chan api.TaskRun]bool{}
	}
	if w.byTask[key] == nil {
		w.byTask[key] = map[chan api.TaskRun]bool{}
	}
	ch := make(chan api.TaskRun, taskWatchBuffer)
	w.byTask[key][ch] = true
	return ch, nil
}

// remove undoes add, forgetting a task nobody watches any more.
func (w *taskWatch) remove(key string, p peer.ID, ch chan api.TaskRun) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.byTask[key][ch] {
		return
	}
	delete(w.byTask[key], ch)
	if len(w.byTask[key]) == 0 {
		delete(w.byTask, key)
	}
	if p != "" {
		w.n--
		if w.perPeer[p]--; w.perPeer[p] == 0 {
			delete(w.perPeer, p)
		}
	}
}

// emit hands a run to every watcher of key without waiting for any.
func (w *taskWatch) emit(key string, run api.TaskRun) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.byTask[key] {
		select {
		case ch <- run:
		default:
			w.dropped++
		}
	}
}

// runEvent is what a watcher sees of one run.
func (n *Node) runEvent(tribe, name string, st tasks.Status, out json.RawMessage, err error) api.TaskRun {
	ev := api.TaskRun{Time: st.LastRun, Task: name, Tribe: tribe, ID: n.host.ID().String(), Name: n.cfg.Name,
		Run: st.Runs, OK: err == nil, MS: st.LastMS}
	if err != nil {
		// Cut like the output, so a run line fits taskRunLineMax.
		ev.Error = err.Error()
		if len(ev.Error) > maxOutputHead {
			ev.Error = ev.Error[:maxOutputHead]
		}
	}
	if len(out) > maxOutputHead {
		out, _ = json.Marshal(string(out[:maxOutputHead]))
	}
	ev.Output = out
	return ev
}

// decodeTaskWatchRequest reads a watch request line, {"task":
// "<tribe>/<name>"}, refusing anything else.
func decodeTaskWatchRequest(line []byte) (tribe, name string, err error) {
	var req struct {
		Task string `json:"task"`
	}
	if err := strictjson.Decode(line, &req); err != nil {
		return "", "", fmt.Errorf("not a watch request: %w", err)
	}
	tribe, name, ok := strings.Cut(req.Task, "/")
	if !ok || !gossip.ValidName(tribe) || !gossip.ValidName(name) {
		return "", "", fmt.Errorf("task %q: want <tribe>/<name>", req.Task)
	}
	return tribe, name, nil
}

// serveTaskWatch is a member's side: the request names the task
// ("<tribe>/<name>"); a trusted writer or a member of the tribe may watch.
func (n *Node) serveTaskWatch(s network.Stream) {
	defer s.Close()
	s.SetReadDeadline(time.Now().Add(requestTimeout))
	br := bufio.NewReaderSize(s, taskWatchRequestMax)
	line, err := br.ReadSlice('\n')
	var tribe, name string
	if err == nil {
		tribe, name, err = decodeTaskWatchRequest(line)
	}
	refuse := func(msg string) {
		n.tasks.watchRefused.Add(1)
		json.NewEncoder(s).Encode(struct {
			Error string `json:"error"`
		}{msg})
	}
	if err != nil {
		refuse("bad task watch request: " + err.Error())
		s.Reset()
		return
	}
	from := s.Conn().RemotePeer()
	if !n.mayWatch(from, tribe) {
		refuse(fmt.Sprintf("%s may not watch the tasks of tribe %s: trusted writers and its members may", from, tribe))
		return
	}
	// Only a task this node has: one made up would hold a slot forever.
	if _, ok := n.replica.Get(taskKey(tribe, name)); !ok {
		refuse(fmt.Sprintf("this node has no task %s/%s", tribe, name))
		return
	}
	key := tribe + "/" + name
	ch, err := n.tasks.watch.add(key, from)
	if err != nil {
		refuse(err.Error())
		return
	}
	defer n.tasks.watch.remove(key, from, ch)
	s.SetReadDeadline(time.Time{})
	gone := make(chan struct{})
	go func() { // the watcher closes its side when it stops watching
		br.ReadByte()
		close(gone)
	}()
	// Admission and membership can be taken away while the stream is
	// open: asked again before every run and every watchRecheck, so a
	// revoked or departed watcher gets no more runs and frees its slot.
	recheck := time.NewTicker(watchRecheck)
	defer recheck.Stop()
	stillMay := func() bool {
		if n.mayWatch(from, tribe) {
			return true
		}
		refuse(fmt.Sprintf("%s may no longer watch the tasks of tribe %s", from, tribe))
		return false
	}
	enc := json.NewEncoder(s)
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-gone:
			return
		case <-recheck.C:
			if !stillMay() {
				return
			}
		case ev := <-ch:
			if !stillMay() {
				return
			}
			s.SetWriteDeadline(time.Now().Add(watchWriteTimeout))
			if enc.Encode(ev) != nil {
				s.Reset()
				return
			}
		}
	}
}

// watchWriteTimeout bounds a write to a watcher that stopped reading.
const watchWriteTimeout = 10 * time.Second

// mayWatch: trusted writers, and nodes whose membership of tribe counts.
// It reads p's membership entries only, not every tribe's: a watch asks
// before each run it writes.
func (n *Node) mayWatch(p peer.ID, tribe string) bool {
	rules := n.rules()
	switch rules.Status(p) {
	case authority.Open, authority.Trusted:
		return true
	}
	for _, e := range n.replica.Prefix(tribesPrefix + tribe + "/members/" + p.String() + "/") {
		t, id, via, ok := splitMemberKey(e.Key)
		if ok && t == tribe && id == p && len(n.memberVia(rules, tribe, id, via, e)) > 0 {
			return true
		}
	}
	return false
}

// WatchTask implements api.Agent: the runs of this node's own (if it is a
// member) and of every other member, over a stream to each. The members
// are looked at again every watchRecheck: one that joined the tribe, or
// whose membership reached this node, after the watch began is watched
// from then on, and one whose stream ended (it did not hold the task yet,
// it restarted) is watched again.
func (n *Node) WatchTask(ctx context.Context, name string, emit func(*api.TaskRun)) error {
	tribe, ok := n.findTask(name)
	if !ok {
		return api.NotFound(fmt.Errorf("%w %q (see `tribe task list`)", ErrUnknownTask, name))
	}
	key := tribe + "/" + name
	runs := make(chan api.TaskRun, taskWatchBuffer)
	local, err := n.tasks.watch.add(key, "")
	if err != nil {
		return err
	}
	defer n.tasks.watch.remove(key, "", local)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex
	watching := map[peer.ID]bool{}
	watchMembers := func() error {
		targets, err := n.callTargets(api.CallRequest{Tribes: []string{tribe}})
		if err != nil && !errors.Is(err, ErrUnknownTribe) {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, t := range targets {
			if t.id == n.host.ID() || watching[t.id] {
				continue
			}
			watching[t.id] = true
			wg.Go(func() {
				if err := n.watchMember(ctx, t, key, runs); err != nil && ctx.Err() == nil {
					n.log.Debug("task watch", "member", t.id, "err", err)
					// A member that refused (and counted it) or could not
					// be reached is asked again after watchRetry, not at
					// every recheck.
					retry := time.NewTimer(watchRetry)
					select {
					case <-ctx.Done():
					case <-retry.C:
					}
					retry.Stop()
				}
				mu.Lock()
				delete(watching, t.id)
				mu.Unlock()
			})
		}
		return nil
	}
	if err := watchMembers(); err != nil {
		return err
	}
	recheck := time.NewTicker(watchRecheck)
	defer recheck.Stop()
	emit(nil)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-recheck.C:
			watchMembers()
		case ev := <-local:
			emit(&ev)
		case ev := <-runs:
			emit(&ev)
		}
	}
}

// watchRecheck is how often a task watch looks for members it does not
// watch yet; watchRetry how long it leaves a member whose stream failed.
const (
	watchRecheck = time.Second
	watchRetry   = 5 * time.Second
)

// watchMember streams one member's runs of key into runs.
func (n *Node) watchMember(ctx context.Context, t callTarget, key string, runs chan<- api.TaskRun) error {
	if n.host.Network().Connectedness(t.id) != network.Connected {
		n.learnAddrs(t.id, t.addrs)
	}
	s, err := n.host.NewStream(ctx, t.id, TaskWatchProtocol)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	defer s.Close()
	if err := json.NewEncoder(s).Encode(struct {
		Task string `json:"task"`
	}{key}); err != nil {
		return err
	}
	// A member's lines are read whole up to taskRunLineMax: one that
	// sends more without a newline is cut off there, not buffered.
	br := bufio.NewReaderSize(s, taskRunLineMax)
	for {
		b, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			n.tasks.watchOverlong.Add(1)
			s.Reset()
			return fmt.Errorf("a run line over %d bytes", taskRunLineMax)
		}
		if err != nil {
			return err
		}
		ev, err := decodeTaskRunLine(b)
		if errors.Is(err, errBadRunLine) {
			n.tasks.watchMalformed.Add(1)
		}
		if err != nil {
			return err
		}
		// A member speaks for itself only.
		ev.ID, ev.Name = t.id.String(), t.name
		select {
		case runs <- ev:
		case <-ctx.Done():
			return nil
		}
	}
}

// errBadRunLine is a task watch line that does not read.
var errBadRunLine = errors.New("a run line that does not read")

// decodeTaskRunLine reads a member's line of a task watch: a run, or the
// member's refusal (an error with no id), returned as an error.
func decodeTaskRunLine(b []byte) (api.TaskRun, error) {
	var line struct {
		api.TaskRun
		Error string `json:"error"`
	}
	if err := json.Unmarshal(b, &line); err != nil {
		return api.TaskRun{}, fmt.Errorf("%w: %v", errBadRunLine, err)
	}
	if line.ID == "" && line.Error != "" {
		return api.TaskRun{}, errors.New(line.Error)
	}
	ev := line.TaskRun
	ev.Error = line.Error
	return ev, nil
}
