package node

import (
	"context"
	"testing"

	"github.com/tribeagent/tribe/node/api"
)

// A member runs its tribe's task; once it leaves the tribe it stops and
// drops the task from its record.
func TestTaskStopsWhenTheNodeLeavesTheTribe(t *testing.T) {
	ctx := context.Background()
	n := startNode(t, loopbackConfig(t, "a"))
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
