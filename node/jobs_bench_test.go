package node

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api"
)

// BenchmarkJobStepRetained: one step of the job loop on a node that holds
// retained jobs, all finished here, against the same step on a node that
// holds none, in one run (a node steps at every change of a job or of its
// own ack: a burst of jobs costs as many steps). Target: flat in the
// jobs retained.
func BenchmarkJobStepRetained(b *testing.B) {
	ctx := context.Background()
	step := func(n *Node) {
		if _, _, err := n.jobs.runner.Step(&jobHost{n: n}); err != nil {
			b.Fatal(err)
		}
	}
	empty := startNode(b, loopbackConfig(b, "e"))
	full := startNode(b, loopbackConfig(b, "f"))
	for _, n := range []*Node{empty, full} {
		if _, err := n.CreateTribe(ctx, "t"); err != nil {
			b.Fatal(err)
		}
		if _, err := n.Join(ctx, "t", []string{n.cfg.Name}); err != nil {
			b.Fatal(err)
		}
		if _, err := n.LoadPlugin(ctx, "echo", "t", api.LoadRequest{}); err != nil {
			b.Fatal(err)
		}
		waitFor(b, "echo loaded", func() bool { _, ok := n.plugins.get("t", "echo"); return ok })
	}
	const retained = 500
	var last string
	for i := range retained {
		j, err := full.SubmitJob(ctx, api.JobRequest{Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Args: json.RawMessage(strconv.Itoa(i))})
		if err != nil {
			b.Fatal(err)
		}
		last = j.ID
	}
	waitFor(b, "the jobs done", func() bool { j, err := full.Job(ctx, last); return err == nil && j.State == "done" })
	b.ResetTimer()
	var fullNS, emptyNS int64
	for range b.N {
		t := time.Now()
		step(full)
		fullNS += int64(time.Since(t))
		t = time.Now()
		step(empty)
		emptyNS += int64(time.Since(t))
	}
	b.ReportMetric(float64(fullNS)/float64(b.N)/1000, "step_us@"+strconv.Itoa(retained))
	b.ReportMetric(float64(emptyNS)/float64(b.N)/1000, "step_us@0")
	b.ReportMetric(float64(fullNS)/float64(emptyNS), "retained/none")
}
