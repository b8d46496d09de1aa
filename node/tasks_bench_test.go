package node

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/plugins/tasks"
)

// BenchmarkTaskRunVsDirectCalls measures one run of a task's workflow
// through the node's task caller (one deadline per run, each step's plugin
// looked up in what the node loaded for the tribe) against invoking the
// same loaded plugin instances directly, side by side in one run: the
// task machinery's overhead (target: at most 1.2x). Two workflows: echo
// three times (no work: the overhead alone) and sys collect, then echo
// twice (a real collector).
func BenchmarkTaskRunVsDirectCalls(b *testing.B) {
	ctx := context.Background()
	n := startNode(b, loopbackConfig(b, "a"))
	if _, err := n.CreateTribe(ctx, "t"); err != nil {
		b.Fatal(err)
	}
	if _, err := n.Join(ctx, "t", []string{"a"}); err != nil {
		b.Fatal(err)
	}
	for _, p := range []string{"echo", "sys"} {
		if _, err := n.LoadPlugin(ctx, p, "t", api.LoadRequest{}); err != nil {
			b.Fatal(err)
		}
	}
	waitFor(b, "echo and sys loaded", func() bool {
		n.plugins.mu.Lock()
		defer n.plugins.mu.Unlock()
		return n.plugins.loaded["t/echo"] != nil && n.plugins.loaded["t/echo"].inst != nil &&
			n.plugins.loaded["t/sys"] != nil && n.plugins.loaded["t/sys"].inst != nil
	})
	n.plugins.mu.Lock()
	inst := map[string]*plugins.Instance{"echo": n.plugins.loaded["t/echo"].inst, "sys": n.plugins.loaded["t/sys"].inst}
	n.plugins.mu.Unlock()
	echo := tasks.Step{Plugin: "echo", Method: "echo"}
	for _, c := range []struct {
		name    string
		collect tasks.Step
		rounds  int
	}{
		{"echo", tasks.Step{Plugin: "echo", Method: "echo", Args: json.RawMessage(`{"cpu":0.5}`)}, 2000},
		{"sys", tasks.Step{Plugin: "sys", Method: "collect"}, 20},
	} {
		b.Run(c.name, func(b *testing.B) {
			w := tasks.Workflow{Collect: c.collect, Process: []tasks.Step{echo}, Publish: []tasks.Step{echo}}
			caller := taskCaller{n: n, tribe: "t"}
			var task, direct time.Duration
			for b.Loop() {
				start := time.Now()
				for range c.rounds {
					// As runTask does: one deadline for the run.
					rctx, cancel := context.WithTimeout(ctx, plugins.DefaultTimeout)
					_, err := w.Run(rctx, caller)
					cancel()
					if err != nil {
						b.Fatal(err)
					}
				}
				task += time.Since(start)
				start = time.Now()
				for range c.rounds {
					out, err := inst[c.collect.Plugin].Invoke(ctx, c.collect.Method, c.collect.Args)
					if err == nil {
						out, err = inst["echo"].Invoke(ctx, "echo", out)
					}
					if err == nil {
						_, err = inst["echo"].Invoke(ctx, "echo", out)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				direct += time.Since(start)
			}
			runs := float64(b.N * c.rounds)
			b.ReportMetric(float64(task.Nanoseconds())/runs, "ns/task-run")
			b.ReportMetric(float64(direct.Nanoseconds())/runs, "ns/direct-run")
			b.ReportMetric(float64(task)/float64(direct), "task/direct")
		})
	}
}

// stamps is a collect plugin that notes when each node's run began.
type stamps struct {
	mu sync.Mutex
	at map[string][]time.Time
}

type stampPlugin struct {
	s    *stamps
	node string
}

func (stampPlugin) Name() string       { return "stamp" }
func (stampPlugin) Version() string    { return "1" }
func (stampPlugin) Kind() plugins.Kind { return plugins.Collector }
func (stampPlugin) Methods() []string  { return []string{"now"} }
func (p stampPlugin) Call(context.Context, string, json.RawMessage) (json.RawMessage, error) {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	p.s.at[p.node] = append(p.s.at[p.node], time.Now())
	return json.RawMessage(`{}`), nil
}

// BenchmarkTaskScheduleJitter runs a task every second on 25 members (real
// nodes on loopback in one process, no splay) and reports how late each
// run began against its tick (creation + k seconds): p50, p99 and the
// worst (target: p99 at most 50 ms).
func BenchmarkTaskScheduleJitter(b *testing.B) {
	ctx := context.Background()
	const members = 25
	s := &stamps{at: map[string][]time.Time{}}
	var nodes []*Node
	for i := range members {
		name := string(rune('a'+i/10)) + string(rune('0'+i%10))
		reg := plugins.Builtins(plugins.Env{})
		reg.Register("stamp", func(map[string]string) (plugins.Plugin, error) { return stampPlugin{s, name}, nil })
		c := loopbackConfig(b, name)
		if i > 0 {
			c.Join = []string{tcpAddr(nodes[0])}
		}
		nodes = append(nodes, startNodeDeps(b, c, Deps{Plugins: reg}))
	}
	first := nodes[0]
	waitFor(b, "every node to know all", func() bool {
		for _, n := range nodes {
			if len(n.nodeRecords()) != members {
				return false
			}
		}
		return true
	})
	if _, err := first.CreatePolicy(ctx, "all", "t", "true"); err != nil {
		b.Fatal(err)
	}
	if _, err := first.LoadPlugin(ctx, "stamp", "t", api.LoadRequest{}); err != nil {
		b.Fatal(err)
	}
	waitFor(b, "stamp loaded on every member", func() bool {
		st := pluginStates(first, "t")
		loaded := 0
		for _, v := range st {
			if v == "loaded" {
				loaded++
			}
		}
		return loaded == members
	})
	for b.Loop() {
		s.mu.Lock()
		clear(s.at)
		s.mu.Unlock()
		task, err := first.CreateTask(ctx, "t", api.TaskRequest{Manifest: "name: jitter\nschedule: {interval: 1s}\nworkflow: {collect: {plugin: stamp, method: now}}\n"})
		if err != nil {
			b.Fatal(err)
		}
		time.Sleep(6 * time.Second)
		if _, err := first.DeleteTask(ctx, "jitter"); err != nil {
			b.Fatal(err)
		}
		var late []time.Duration
		s.mu.Lock()
		for _, ts := range s.at {
			for _, at := range ts {
				since := at.Sub(task.Created)
				late = append(late, since-since.Truncate(time.Second))
			}
		}
		s.mu.Unlock()
		if len(late) < members*3 {
			b.Fatalf("only %d runs on %d members in 6 s", len(late), len(s.at))
		}
		slices.Sort(late)
		pct := func(p float64) float64 { return float64(late[int(p*float64(len(late)-1))].Microseconds()) / 1000 }
		b.ReportMetric(pct(0.5), "p50-late-ms")
		b.ReportMetric(pct(0.99), "p99-late-ms")
		b.ReportMetric(pct(1), "max-late-ms")
		b.ReportMetric(float64(len(late)), "runs")
	}
}
