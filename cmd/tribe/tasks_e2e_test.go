package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api"
)

// lines counts the lines of a file the file plugin writes (0 if none yet).
func lines(a *agentProc, name string) int {
	b, _ := os.ReadFile(filepath.Join(a.dir, "files", name))
	return strings.Count(string(b), "\n")
}

// Tribe core (two agents, by policy) runs a task every second: collect
// sys, publish with file on each member and to the one member of tribe
// sink; task show reports the runs from the members' records; a third
// agent that joins core later runs it too; task stop stops them
// everywhere; a manifest naming a plugin not loaded is refused and writes
// nothing.
func TestTaskRunsOnEveryMemberAndPublishesToAnotherTribe(t *testing.T) {
	c1 := newAgent(t, "c1", "--fact", "role=core")
	c1.start()
	seed := c1.tcpJoin()
	c2 := newAgent(t, "c2", "--join", seed, "--fact", "role=core")
	c2.start()
	s1 := newAgent(t, "s1", "--join", seed, "--fact", "role=sink")
	s1.start()
	run := c1.run
	run(0, "policy", "create", "core", "--tribe", "core", `facts.role == "core"`)
	run(0, "policy", "create", "sink", "--tribe", "sink", `facts.role == "sink"`)
	waitUntil(t, 30*time.Second, "both tribes to form", func() bool {
		var core, sink api.Tribe
		c1.cliJSON(&core, "show", "core")
		c1.cliJSON(&sink, "show", "sink")
		return len(core.Members) == 2 && len(sink.Members) == 1
	})
	run(0, "plugin", "load", "sys", "--tribe", "core")
	run(0, "plugin", "load", "file", "--tribe", "core", "--config", "path=core.jsonl")
	run(0, "plugin", "load", "file", "--tribe", "sink", "--config", "path=sink.jsonl", "--callers", "tribe:core")

	manifest := filepath.Join(t.TempDir(), "task.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(manifest, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("name: metrics\nschedule: {interval: 1s}\nworkflow:\n  collect: {plugin: echo, method: echo}\n")
	if out := run(1, "task", "create", "--tribe", "core", "-f", manifest); !strings.Contains(out, "plugin echo is not loaded in tribe core") {
		t.Errorf("a step's plugin not loaded: %q", out)
	}
	if out := run(0, "task", "list"); strings.Contains(out, "metrics") {
		t.Errorf("a refused task was written: %q", out)
	}

	write(`name: metrics
schedule: {interval: 1s}
workflow:
  collect: {plugin: sys, method: collect}
  publish:
    - {plugin: file, method: publish}
    - {plugin: file, method: publish, tribe: sink}
`)
	run(0, "task", "create", "--tribe", "core", "-f", manifest)
	// s1, not a member, watches: runs come from both members. It must hold
	// the task first (a watch of a task it does not know ends at once).
	waitUntil(t, 30*time.Second, "s1 to hold the task", func() bool {
		out, _, code := tribe("task", "list", "--data-dir", s1.dir)
		return code == 0 && strings.Contains(out, "metrics")
	})
	w := startTaskWatch(t, s1, "metrics")
	from := map[string]bool{}
	for deadline := time.Now().Add(60 * time.Second); len(from) < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("runs watched for 60s came from %v only, want c1 and c2", from)
		}
		r := w.next()
		if !r.OK || r.Task != "metrics" || r.Tribe != "core" || r.Run < 1 || !strings.Contains(string(r.Output), "load") {
			t.Fatalf("a watched run: %+v", r)
		}
		from[r.Name] = true
	}
	if !from["c1"] || !from["c2"] {
		t.Errorf("runs watched from %v, want c1 and c2", from)
	}
	waitUntil(t, 60*time.Second, "3 runs published on each core member and at least 3 on the sink", func() bool {
		return lines(c1, "core.jsonl") >= 3 && lines(c2, "core.jsonl") >= 3 && lines(s1, "sink.jsonl") >= 3
	})
	if b, _ := os.ReadFile(filepath.Join(c2.dir, "files", "core.jsonl")); !strings.Contains(string(b), "load") {
		t.Errorf("c2's file does not hold sys metrics: %.200s", b)
	}
	var shown api.Task
	waitUntil(t, 30*time.Second, "task show to report the runs of both members", func() bool {
		c2.cliJSON(&shown, "task", "show", "metrics")
		ok := len(shown.Members) == 2
		for _, m := range shown.Members {
			ok = ok && m.State == "running" && m.Runs >= 3 && m.Failures == 0
		}
		return ok
	})

	// A node that joins the tribe later starts the task.
	c3 := newAgent(t, "c3", "--join", seed, "--fact", "role=core")
	c3.start()
	waitUntil(t, 60*time.Second, "c3, joining core, to run the task", func() bool { return lines(c3, "core.jsonl") >= 1 })

	run(0, "task", "stop", "metrics")
	waitUntil(t, 30*time.Second, "both members to report the task stopped", func() bool {
		c1.cliJSON(&shown, "task", "show", "metrics")
		ok := shown.Stopped && len(shown.Members) == 3
		for _, m := range shown.Members {
			ok = ok && m.State == "stopped"
		}
		return ok
	})
	before := lines(c1, "core.jsonl")
	time.Sleep(2500 * time.Millisecond) // two and a half intervals
	if after := lines(c1, "core.jsonl"); after != before {
		t.Errorf("c1 ran the stopped task: %d lines, then %d", before, after)
	}
	run(0, "task", "delete", "metrics")
	if out := run(1, "task", "show", "metrics"); !strings.Contains(out, `unknown task "metrics"`) {
		t.Errorf("show after delete: %q", out)
	}
}

// taskWatcher is a running `tribe task watch --json`.
type taskWatcher struct {
	t    *testing.T
	runs chan api.TaskRun
}

func startTaskWatch(t *testing.T, a *agentProc, name string) *taskWatcher {
	t.Helper()
	cmd := exec.Command(tribeBin, "task", "watch", name, "--json", "--data-dir", a.dir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	w := &taskWatcher{t: t, runs: make(chan api.TaskRun, 64)}
	go func() {
		dec := json.NewDecoder(stdout)
		for {
			var r api.TaskRun
			if dec.Decode(&r) != nil {
				close(w.runs)
				return
			}
			w.runs <- r
		}
	}()
	return w
}

func (w *taskWatcher) next() api.TaskRun {
	w.t.Helper()
	select {
	case r, ok := <-w.runs:
		if !ok {
			w.t.Fatal("tribe task watch ended")
		}
		return r
	case <-time.After(60 * time.Second):
		w.t.Fatal("no task run watched within 60s")
	}
	return api.TaskRun{}
}
