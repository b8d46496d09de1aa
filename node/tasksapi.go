package node

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins/tasks"
)

// ErrUnknownTask is returned for a task name no tribe has.
var ErrUnknownTask = errors.New("unknown task")

// CreateTask implements api.Agent: the manifest is checked where it is
// typed (it decodes and validates; every step's plugin is one this agent
// knows and is loaded in the tribe it runs in: the task's tribe, or a
// publish step's tribe; the name is free in every tribe), then written.
// Anything wrong is refused with every reason and nothing is written.
func (n *Node) CreateTask(ctx context.Context, tribe string, req api.TaskRequest) (api.Task, error) {
	m, err := tasks.Decode([]byte(req.Manifest))
	if err != nil {
		return api.Task{}, api.BadRequest(errors.New(strings.TrimPrefix(err.Error(), "tasks: ")))
	}
	if err := checkTribeName(tribe); err != nil {
		return api.Task{}, err
	}
	if err := n.replica.Trust().Authorize(taskKey(tribe, m.Name), n.host.ID()); err != nil {
		return api.Task{}, writeErr(err)
	}
	all := n.tribes()
	if _, ok := all[tribe]; !ok {
		return api.Task{}, api.NotFound(fmt.Errorf("%w %q (see `tribe list`)", ErrUnknownTribe, tribe))
	}
	held := n.tasksHeld()
	other, ok := held[m.Name]
	if ok && other != tribe {
		return api.Task{}, api.BadRequest(fmt.Errorf("a task %q exists in tribe %s: task names are unique across tribes", m.Name, other))
	}
	if !ok && len(held) >= MaxTasks {
		return api.Task{}, api.BadRequest(fmt.Errorf("the fleet has %d tasks, the most it takes (tribe task delete one first)", len(held)))
	}
	var errs []error
	for _, s := range m.Workflow.Steps() {
		in := cmp.Or(s.Tribe, tribe)
		// The plugin need not be on this host (an external one is on the
		// members that installed it): loaded in the tribe is what counts.
		switch {
		case all[in] == nil:
			errs = append(errs, fmt.Errorf("a step publishes to tribe %q, which does not exist", in))
		case !slices.Contains(all[in].plugins, s.Plugin):
			errs = append(errs, fmt.Errorf("plugin %s is not loaded in tribe %s (tribe plugin load %s --tribe %s)", s.Plugin, in, s.Plugin, in))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return api.Task{}, api.BadRequest(err)
	}
	mb, _ := json.Marshal(m)
	rec := taskRecord{Manifest: mb, Created: n.now().UTC()}
	b, _ := json.Marshal(rec)
	if _, err := n.replica.Put(ctx, taskKey(tribe, m.Name), b); err != nil {
		return api.Task{}, writeErr(err)
	}
	return n.taskView(tribe, m.Name, rec), nil
}

// MaxTasks bounds the tasks of the whole fleet (names are unique across
// tribes): a member reports each task it runs in its record, whose size
// is bounded.
const MaxTasks = 100

// tasksHeld is the tribe of each task the state holds, by name (names are
// unique across tribes).
func (n *Node) tasksHeld() map[string]string {
	held := map[string]string{}
	for _, e := range n.replica.Prefix(tribesPrefix) {
		if segs := strings.Split(e.Key, "/"); len(segs) == 4 && segs[2] == "tasks" {
			held[segs[3]] = segs[1]
		}
	}
	return held
}

// findTask is the tribe that has a task named name.
func (n *Node) findTask(name string) (string, bool) {
	tribe, ok := n.tasksHeld()[name]
	return tribe, ok
}

// taskEntry reads a task's entry by name.
func (n *Node) taskEntry(name string) (string, taskRecord, error) {
	tribe, ok := n.findTask(name)
	if !ok {
		return "", taskRecord{}, api.NotFound(fmt.Errorf("%w %q (see `tribe task list`)", ErrUnknownTask, name))
	}
	var rec taskRecord
	e, _ := n.replica.Get(taskKey(tribe, name))
	if err := json.Unmarshal(e.Value, &rec); err != nil {
		return tribe, rec, fmt.Errorf("node: task %s: unreadable entry: %w", name, err)
	}
	return tribe, rec, nil
}

// Tasks implements api.Agent.
func (n *Node) Tasks(ctx context.Context, tribe string) ([]api.Task, error) {
	out := []api.Task{}
	for _, e := range n.replica.Prefix(tribesPrefix) {
		segs := strings.Split(e.Key, "/")
		if len(segs) != 4 || segs[2] != "tasks" || (tribe != "" && segs[1] != tribe) {
			continue
		}
		var rec taskRecord
		json.Unmarshal(e.Value, &rec)
		out = append(out, n.taskView(segs[1], segs[3], rec))
	}
	return out, nil
}

// Task implements api.Agent.
func (n *Node) Task(ctx context.Context, name string) (api.Task, error) {
	tribe, rec, err := n.taskEntry(name)
	if err != nil {
		return api.Task{}, err
	}
	return n.taskView(tribe, name, rec), nil
}

// SetTaskStopped implements api.Agent.
func (n *Node) SetTaskStopped(ctx context.Context, name string, stopped bool) (api.Task, error) {
	tribe, rec, err := n.taskEntry(name)
	if err != nil {
		return api.Task{}, err
	}
	if err := n.replica.Trust().Authorize(taskKey(tribe, name), n.host.ID()); err != nil {
		return api.Task{}, writeErr(err)
	}
	rec.Stopped = stopped
	b, _ := json.Marshal(rec)
	if _, err := n.replica.Put(ctx, taskKey(tribe, name), b); err != nil {
		return api.Task{}, writeErr(err)
	}
	return n.taskView(tribe, name, rec), nil
}

// DeleteTask implements api.Agent.
func (n *Node) DeleteTask(ctx context.Context, name string) (api.Task, error) {
	tribe, rec, err := n.taskEntry(name)
	if err != nil {
		return api.Task{}, err
	}
	if _, err := n.replica.Delete(ctx, taskKey(tribe, name)); err != nil {
		return api.Task{}, writeErr(err)
	}
	t := n.taskView(tribe, name, rec)
	t.Members = []api.TaskMember{}
	return t, nil
}

// taskView is a task with each member's report, from the members' records.
func (n *Node) taskView(tribe, name string, rec taskRecord) api.Task {
	var m tasks.Manifest
	json.Unmarshal(rec.Manifest, &m)
	sched, _ := json.Marshal(m.Schedule)
	work, _ := json.Marshal(m.Workflow)
	t := api.Task{Name: name, Tribe: tribe, Schedule: sched, Workflow: work, Stopped: rec.Stopped, Created: rec.Created, Members: []api.TaskMember{}}
	v := n.tribes()[tribe]
	if v == nil {
		return t
	}
	// Records by ID, looked up once per member: not every record compared
	// with every member.
	records := n.nodeRecords()
	for _, mem := range n.members(v) {
		tm := api.TaskMember{ID: mem.ID, Name: mem.Name, State: "pending"}
		if id, err := peer.Decode(mem.ID); err == nil {
			if st, ok := records[id].Tasks[tribe+"/"+name]; ok {
				tm.State, tm.Runs, tm.Failures, tm.LastRun, tm.LastMS, tm.Error = st.State, st.Runs, st.Failures, st.LastRun, st.LastMS, st.Error
			}
		}
		t.Members = append(t.Members, tm)
	}
	return t
}
