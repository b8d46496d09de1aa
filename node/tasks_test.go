package node

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins/tasks"
)

// echoTribeOfOne makes n, named "a", the one member of tribe t, with echo
// loaded.
func echoTribeOfOne(t *testing.T, n *Node) {
	t.Helper()
	ctx := context.Background()
	if _, err := n.CreateTribe(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Join(ctx, "t", []string{"a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.LoadPlugin(ctx, "echo", "t", api.LoadRequest{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "echo loaded", func() bool { return pluginStates(n, "t")["a"] == "loaded" })
}

// A member runs its tribe's task; once it leaves the tribe it stops and
// drops the task from its record.
func TestTaskStopsWhenTheNodeLeavesTheTribe(t *testing.T) {
	ctx := context.Background()
	n := startNode(t, loopbackConfig(t, "a"))
	echoTribeOfOne(t, n)
	if _, err := n.CreateTask(ctx, "t", api.TaskRequest{Manifest: "name: e\nschedule: {interval: 1s}\nworkflow: {collect: {plugin: echo, method: echo}}\n"}); err != nil {
		t.Fatal(err)
	}
	runs := func() (int, bool) {
		st, ok := n.tasks.statuses()["t/e"]
		return st.Runs, ok
	}
	waitFor(t, "a run", func() bool { r, _ := runs(); return r >= 1 })
	if _, err := n.Leave(ctx, "t", []string{"a"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the task to stop and leave the statuses", func() bool {
		n.tasks.mu.Lock()
		defer n.tasks.mu.Unlock()
		_, running := n.tasks.running["t/e"]
		_, reported := n.tasks.status["t/e"]
		return !running && !reported
	})
}

// A task's runs count on across a restart: one with count: 1 that ran
// does not run again when the agent starts again from its data dir.
func TestTaskRunsCountAcrossARestart(t *testing.T) {
	ctx := context.Background()
	cfg := loopbackConfig(t, "a")
	n := startNode(t, cfg)
	echoTribeOfOne(t, n)
	if _, err := n.CreateTask(ctx, "t", api.TaskRequest{Manifest: "name: once\nschedule: {interval: 1s, count: 1}\nworkflow: {collect: {plugin: echo, method: echo}}\n"}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.CreateTask(ctx, "t", api.TaskRequest{Manifest: "name: broken\nschedule: {interval: 1s}\nworkflow: {collect: {plugin: echo, method: nope}}\nmax_failures: 1\n"}); err != nil {
		t.Fatal(err)
	}
	stored := func(n *Node) tasks.Status {
		e, _ := n.replica.Get(nodesPrefix + n.ID().String())
		var rec nodeRecord
		json.Unmarshal(e.Value, &rec)
		return rec.Tasks["t/once"]
	}
	storedOf := func(n *Node, task string) tasks.Status {
		e, _ := n.replica.Get(nodesPrefix + n.ID().String())
		var rec nodeRecord
		json.Unmarshal(e.Value, &rec)
		return rec.Tasks["t/"+task]
	}
	waitFor(t, "the run, in the record", func() bool { st := stored(n); return st.Runs == 1 && st.State == tasks.Done })
	waitFor(t, "the broken task disabled, in the record", func() bool { return storedOf(n, "broken").State == tasks.Disabled })
	ran := stored(n).LastRun
	n.Close()

	n = startNode(t, cfg)
	waitFor(t, "echo loaded again", func() bool { return pluginStates(n, "t")["a"] == "loaded" })
	time.Sleep(1500 * time.Millisecond) // past the interval
	if st, ok := n.tasks.statuses()["t/once"]; !ok || st.Runs != 1 || st.State != tasks.Done || !st.LastRun.Equal(ran) {
		t.Fatalf("after a restart: %+v (%v), want the one run of %v, done", st, ok, ran)
	}
	if st := n.tasks.statuses()["t/broken"]; st.State != tasks.Disabled || st.Runs != 1 {
		t.Fatalf("the disabled task after a restart: %+v, want it disabled after its one run", st)
	}
}

// The fleet takes at most MaxTasks tasks (a new one past that is refused,
// saying so; an existing one may still be replaced), and a member whose
// task errors would push its record over the size limit writes it
// without them rather than not at all.
func TestTaskLimits(t *testing.T) {
	ctx := context.Background()
	n := startNode(t, loopbackConfig(t, "a"))
	if _, err := n.CreateTribe(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.LoadPlugin(ctx, "echo", "t", api.LoadRequest{}); err != nil {
		t.Fatal(err)
	}
	manifest := func(name string) api.TaskRequest {
		return api.TaskRequest{Manifest: "name: " + name + "\nschedule: {interval: 1h}\nworkflow: {collect: {plugin: echo, method: echo}}\n"}
	}
	for i := range MaxTasks {
		if _, err := n.CreateTask(ctx, "t", manifest(fmt.Sprintf("t%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.CreateTask(ctx, "t", manifest("onemore")); err == nil || !strings.Contains(err.Error(), "the fleet has 100 tasks, the most it takes") {
		t.Fatalf("task %d: %v, want it refused", MaxTasks+1, err)
	}
	if _, err := n.CreateTask(ctx, "t", manifest("t7")); err != nil {
		t.Fatalf("replacing a task at the limit: %v", err)
	}

	// Statuses of tasks this node does not run (it is no member of t):
	// set in the node, its task loop would drop them.
	statuses := map[string]tasks.Status{}
	for i := range 300 {
		statuses[fmt.Sprintf("t/x%d", i)] = tasks.Status{State: tasks.Disabled, Runs: 3, Failures: 3, Error: strings.Repeat("<&>", 85)}
	}
	b, err := n.encodeOwn(nodeRecord{Name: "a", Facts: json.RawMessage(`{"os":"linux"}`), Tasks: statuses})
	if err != nil {
		t.Fatal(err)
	}
	var rec nodeRecord
	if err := json.Unmarshal(b, &rec); err != nil || len(rec.Tasks) < 300 || rec.Tasks["t/x1"].Error != "" || rec.Tasks["t/x1"].Failures != 3 {
		t.Fatalf("%d bytes, %d tasks, %+v: want every status, without its error", len(b), len(rec.Tasks), rec.Tasks["t/x1"])
	}
}
