package node

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/plugins/jobs"
)

// jobTribe makes tribe t of the given nodes (by name) with plugin loaded,
// from n, and waits until every member has it loaded.
func jobTribe(t *testing.T, n *Node, tribe, plugin string, members []*Node) {
	t.Helper()
	ctx := context.Background()
	if _, err := n.CreateTribe(ctx, tribe); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range members {
		names = append(names, m.cfg.Name)
	}
	waitFor(t, "every member known by name", func() bool { _, err := n.resolve(names); return err == nil })
	if _, err := n.Join(ctx, tribe, names); err != nil {
		t.Fatal(err)
	}
	if _, err := n.LoadPlugin(ctx, plugin, tribe, api.LoadRequest{}); err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		waitFor(t, plugin+" loaded on "+m.cfg.Name, func() bool { return pluginStates(m, tribe)[m.cfg.Name] == "loaded" })
	}
}

func jobState(t *testing.T, n *Node, id string) api.Job {
	t.Helper()
	j, err := n.Job(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func targetStates(j api.Job) map[string]string {
	out := map[string]string{}
	for _, t := range j.Targets {
		out[t.Name] = t.State
	}
	return out
}

// A job reaches every target: the one that is up at once, the one that
// was down when it comes back; each output can be fetched and matches.
func TestJobReachesATargetThatWasDown(t *testing.T) {
	ctx := context.Background()
	a := startNode(t, loopbackConfig(t, "a"))
	bc := loopbackConfig(t, "b")
	bc.Join = []string{tcpAddr(a)}
	b := startNode(t, bc)
	jobTribe(t, a, "t", "echo", []*Node{a, b})

	j, err := a.SubmitJob(ctx, api.JobRequest{Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Args: json.RawMessage(`{"hello":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job done on both", func() bool { return jobState(t, a, j.ID).State == "done" })
	// The job entry and two acks, each a signed envelope of some 200 bytes.
	if sb := jobState(t, a, j.ID).StateBytes; sb < 3*150 || sb > 3*2048 {
		t.Errorf("state bytes of a job with two targets: %d", sb)
	}

	b.Close()
	j2, err := a.SubmitJob(ctx, api.JobRequest{Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Args: json.RawMessage(`"second"`)})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second job done on a", func() bool { return targetStates(jobState(t, a, j2.ID))["a"] == "done" })
	if s := jobState(t, a, j2.ID); s.State != "pending" || targetStates(s)["b"] != "pending" {
		t.Fatalf("with b down: %+v", s)
	}
	bc.Join = []string{tcpAddr(a)}
	b2 := startNode(t, bc) // the same data dir: the same node
	waitFor(t, "the second job done on b after its restart", func() bool { return jobState(t, a, j2.ID).State == "done" })
	for _, target := range []string{"a", "b"} {
		o, err := a.JobOutput(ctx, j2.ID, target)
		if err != nil || o.Output != `"second"` {
			t.Fatalf("output on %s: %+v %v", target, o, err)
		}
	}
	// b ran each job once: two acks, each one attempt.
	for _, id := range []string{j.ID, j2.ID} {
		if a, ok := b2.ownAck(id); !ok || a.Attempts != 1 || a.State != jobs.Done {
			t.Fatalf("b's ack of %s: %+v", id, a)
		}
	}
}

// A node that crashes while it runs a job finds its running ack at the
// next start and reports the job interrupted, without running it again.
func TestJobInterruptedByACrash(t *testing.T) {
	ctx := context.Background()
	c := loopbackConfig(t, "a")
	c.Exec = plugins.ExecConfig{Commands: map[string]plugins.Command{"slow": {Argv: []string{"sleep", "30"}}}}
	a := startNode(t, c)
	jobTribe(t, a, "t", "exec", []*Node{a})
	j, err := a.SubmitJob(ctx, api.JobRequest{Tribes: []string{"t"}, Plugin: "exec", Method: "run", Args: json.RawMessage(`{"command":"slow"}`)})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job running", func() bool { return targetStates(jobState(t, a, j.ID))["a"] == "running" })
	a.Crash()
	a2 := startNode(t, c)
	waitFor(t, "the job interrupted", func() bool { return jobState(t, a2, j.ID).State == "failed" })
	ack, _ := a2.ownAck(j.ID)
	if ack.State != jobs.Interrupted || ack.Attempts != 1 || !strings.Contains(ack.Error, "interrupted") {
		t.Fatalf("ack after the crash: %+v", ack)
	}
}

// Submission refuses what cannot run, and an agent that is not a trusted
// writer; a forged ack from another node changes nothing.
func TestJobRefusals(t *testing.T) {
	ctx := context.Background()
	a := startNode(t, loopbackConfig(t, "a"))
	jobTribe(t, a, "t", "echo", []*Node{a})
	for name, req := range map[string]api.JobRequest{
		"unknown plugin":    {Tribes: []string{"t"}, Plugin: "nope", Method: "x"},
		"not loaded there":  {Tribes: []string{"t"}, Plugin: "sys", Method: "collect"},
		"unknown tribe":     {Tribes: []string{"zzz"}, Plugin: "echo", Method: "echo"},
		"unknown node":      {Nodes: []string{"nobody"}, Plugin: "echo", Method: "echo"},
		"no targets":        {Plugin: "echo", Method: "echo"},
		"bad args":          {Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Args: json.RawMessage(`{`)},
		"oversized args":    {Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Args: json.RawMessage(`"` + strings.Repeat("a", jobs.MaxArgs) + `"`)},
		"expiry too long":   {Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Expires: 31 * 24 * time.Hour},
		"too many retries":  {Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Retries: 11},
		"include-new alone": {Nodes: []string{"a"}, Plugin: "echo", Method: "echo", IncludeNew: true},
	} {
		if _, err := a.SubmitJob(ctx, req); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if js, _ := a.Jobs(ctx, ""); len(js) != 0 {
		t.Fatalf("refused submissions wrote jobs: %+v", js)
	}

	// b is not a trusted writer: it may not submit, and its job entries
	// and its acks written for a are refused by every replica.
	oc := loopbackConfig(t, "b")
	oc.Join = []string{tcpAddr(a)}
	oc.Trusted = []string{a.ID().String()}
	b := startNode(t, oc)
	if _, err := b.SubmitJob(ctx, api.JobRequest{Nodes: []string{"a"}, Plugin: "echo", Method: "echo"}); err == nil || !errors.Is(err, gossip.ErrUnauthorized) && !strings.Contains(err.Error(), "may not write") {
		t.Fatalf("an untrusted writer's submission: %v", err)
	}
	if _, err := b.replica.Put(ctx, ackKey("x1", a.ID()), []byte(`{"state":"done"}`)); !errors.Is(err, gossip.ErrUnauthorized) {
		t.Fatalf("an ack for another node: %v", err)
	}
}

// Acks go to the job's writer, not to every node: a node that did not
// write the job learns them by pulling from the writer when asked for the
// job's status. An output too long for the ack's head stays on the target
// and is fetched whole. A target that cannot reach the writer publishes
// its ack instead.
func TestJobAcksGoToTheWriter(t *testing.T) {
	ctx := context.Background()
	a := startNode(t, loopbackConfig(t, "a"))
	var bc, cc Config
	for _, c := range []*Config{&bc, &cc} {
		*c = loopbackConfig(t, map[*Config]string{&bc: "b", &cc: "c"}[c])
		c.Join = []string{tcpAddr(a)}
		c.SyncInterval = time.Hour // no periodic anti-entropy to hide where acks go
	}
	b, c := startNode(t, bc), startNode(t, cc)
	jobTribe(t, a, "t", "echo", []*Node{b, c})

	long := `"` + strings.Repeat("x", 3*jobs.HeadLen) + `"`
	j, err := a.SubmitJob(ctx, api.JobRequest{Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Args: json.RawMessage(long)})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job done on the writer", func() bool { return jobState(t, a, j.ID).State == "done" })
	if _, ok := c.replica.Get(ackKey(j.ID, b.ID())); ok {
		t.Fatal("b's ack reached c before c asked: acks are broadcast")
	}
	if s := jobState(t, c, j.ID); s.State != "done" || s.Counts["done"] != 2 {
		t.Fatalf("the job as c shows it: %+v", s)
	}
	if o, err := c.JobOutput(ctx, j.ID, "b"); err != nil || o.Output != long {
		t.Fatalf("b's output, fetched whole: %d bytes, %v", len(o.Output), err)
	}
	if n := b.jobs.acksPublished.Load() + c.jobs.acksPublished.Load(); n != 0 {
		t.Errorf("%d acks published with the writer in reach", n)
	}

	// With the writer gone, c's ack of the next job is published: b,
	// where it is asked, gets it without pulling.
	c.Close()
	j2, err := a.SubmitJob(ctx, api.JobRequest{Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Args: json.RawMessage(`"2"`)})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b has the second job", func() bool { _, ok := b.replica.Get(jobKey(j2.ID)); return ok })
	a.Close()
	cc.Join = []string{tcpAddr(b)}
	c2 := startNode(t, cc)
	waitFor(t, "c's ack of the second job on b", func() bool { _, ok := b.replica.Get(ackKey(j2.ID, c2.ID())); return ok })
	if c2.jobs.acksPublished.Load() == 0 {
		t.Error("c reached b's state without publishing its ack")
	}
}

// With a trust list, a job goes only to its targets: a node outside them
// does not hold it until asked, and then pulls it (and its acks) from the
// trusted writers. A job stream comes only from a trusted writer, the
// only author of jobs: another node's, whatever it carries (a job handed
// on, its own record), is refused before it is read, and counted.
func TestJobReachesOnlyItsTargets(t *testing.T) {
	a, b, _, d, j := trustedJobDone(t)
	// Published only if a hand-off failed (seen on a loaded machine),
	// the job reaches every node.
	if _, ok := d.replica.Get(jobKey(j.ID)); ok && a.jobs.jobsPublished.Load() == 0 {
		t.Fatal("d, no target, was sent the job")
	} else if ok {
		t.Log("a hand-off failed: the job was published")
	}
	// Each ask fetches the acks from the writer, within 2 s: on a loaded
	// machine one may come back with what d holds, as a status asked
	// again gets the writer's.
	waitFor(t, "the job done as d shows it, asked", func() bool {
		s := jobState(t, d, j.ID)
		return s.State == "done" && s.Counts["done"] == 2
	})

	rejected := func(n *Node) (sum int64) {
		for _, v := range n.rejected() {
			sum += v
		}
		return sum
	}
	before := rejected(b)
	job, _ := d.replica.Get(jobKey(j.ID))
	own, _ := d.replica.Get(nodesPrefix + d.ID().String())
	for what, e := range map[string]*gossip.Signed{"a's job": job, "d's own record": own} {
		if err := d.handJob(b.ID(), e, func() bool { return true }); err == nil {
			t.Errorf("%s handed to b by d: taken", what)
		}
	}
	if got := rejected(b) - before; got != 2 {
		t.Errorf("b counted %d refusals, want 2", got)
	}
	if b.jobs.handRefused.Load() != 2 {
		t.Errorf("job streams from a node that is not a trusted writer: %d counted, want 2", b.jobs.handRefused.Load())
	}
}

// A peer that opens job streams and sends nothing holds at most
// maxHandingPerPeer of them; the rest are refused at once and counted.
// With no trust list, so that the peer is a trusted writer.
func TestJobHandOffsAreBoundedPerPeer(t *testing.T) {
	a := startNode(t, loopbackConfig(t, "a"))
	bc := loopbackConfig(t, "b")
	bc.Join = []string{tcpAddr(a)}
	b := startNode(t, bc)
	waitFor(t, "b connected", func() bool { return len(b.ConnectedPeers()) > 0 })
	ctx := context.Background()
	for range maxHandingPerPeer + 3 {
		s, err := b.host.NewStream(ctx, a.ID(), JobProtocol)
		if err != nil {
			t.Fatal(err)
		}
		s.Write([]byte("x")) // opens the stream on the other side; never ends
		defer s.Reset()
	}
	waitFor(t, "the streams past the bound refused", func() bool { return a.jobs.handBusy.Load() == 3 })
	if got := a.rejected()["job_handoff_busy"]; got != 3 {
		t.Errorf("job_handoff_busy %d, want 3", got)
	}
}

// With a trust list, a peer that is not a trusted writer (which alone
// can author a job) is refused before it takes a hand-off slot, and
// counted: strangers cannot hold the slots writers need.
func TestJobHandOffRefusesStrangersBeforeASlot(t *testing.T) {
	admin, stranger := adminAndStranger(t)
	ctx := context.Background()
	for range maxHandingPerPeer + 3 {
		s, err := stranger.host.NewStream(ctx, admin.ID(), JobProtocol)
		if err != nil {
			t.Fatal(err)
		}
		s.Write([]byte("x"))
		defer s.Reset()
	}
	waitFor(t, "every stream refused", func() bool { return admin.jobs.handRefused.Load() == maxHandingPerPeer+3 })
	if got := admin.rejected(); got["job_handoff_busy"] != 0 || got["job_handoff_refused"] != maxHandingPerPeer+3 {
		t.Errorf("job_handoff_busy %d, job_handoff_refused %d", got["job_handoff_busy"], got["job_handoff_refused"])
	}
}

// A writer that does not wait on the hand-off stream for the ack (more
// targets wait than it keeps streams for) still gets it: the target's
// answer fails, and it pushes the ack.
func TestJobAckPushedWhenTheHandOffDoesNotWait(t *testing.T) {
	ac := loopbackConfig(t, "a")
	ac.SyncInterval = time.Hour // the ack must come by push, not by a pull
	a := startNode(t, ac)
	bc := loopbackConfig(t, "b")
	bc.Join, bc.SyncInterval = []string{tcpAddr(a)}, time.Hour
	b := startNode(t, bc)
	jobTribe(t, a, "t", "echo", []*Node{b})
	// The job written as SubmitJob writes it, but handed by hand.
	j, e := writeEchoJob(t, a, b)
	if err := a.handJob(b.ID(), e, func() bool { return false }); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b's ack on a, pushed", func() bool { return jobState(t, a, j.ID).State == "done" })
	if n := b.jobs.acksPublished.Load(); n != 0 {
		t.Errorf("b published %d acks: the push did not reach a", n)
	}
}

// writerAndTarget starts a and b, b joining a (with set's changes to its
// config), in tribe t with plugin loaded on b.
func writerAndTarget(t *testing.T, plugin string, set func(*Config)) (a, b *Node) {
	t.Helper()
	a = startNode(t, loopbackConfig(t, "a"))
	bc := loopbackConfig(t, "b")
	bc.Join = []string{tcpAddr(a)}
	set(&bc)
	b = startNode(t, bc)
	jobTribe(t, a, "t", plugin, []*Node{b})
	return a, b
}

// A job handed to a target that runs it at once is stored with its
// running ack in one store transaction (one disk sync), not alone first;
// its done ack goes to the writer on the job's stream and is stored here
// with the next commit: the target commits once a job.
func TestHandedJobStoredWithItsRunningAck(t *testing.T) {
	ctx := context.Background()
	a, b := writerAndTarget(t, "echo", func(c *Config) { c.SyncInterval = time.Hour })
	fewest := int64(1 << 62)
	for range 3 { // the fewest of three: another write may land meanwhile
		before := b.replica.StoreCommits()
		j, err := a.SubmitJob(ctx, api.JobRequest{Nodes: []string{"b"}, Plugin: "echo", Method: "echo", Args: json.RawMessage(`"x"`)})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the job done", func() bool { return jobState(t, a, j.ID).State == "done" })
		fewest = min(fewest, b.replica.StoreCommits()-before)
	}
	if fewest != 1 {
		t.Fatalf("the target committed %d times for a job it ran at once, want 1 (the job with its running ack)", fewest)
	}
}

// A job handed to a target busy with the one before it (jobs of a tribe
// run one at a time) is stored at once by the job loop, alone, while the
// first runs: its hand-off is answered, not held until it starts.
func TestHandedJobQueuedBehindAnother(t *testing.T) {
	ctx := context.Background()
	a, b := writerAndTarget(t, "exec", func(c *Config) {
		c.Exec = plugins.ExecConfig{Commands: map[string]plugins.Command{"long": {Argv: []string{"sleep", "60"}}, "nap": {Argv: []string{"true"}}}}
	})
	var ids []string
	for _, cmd := range []string{"long", "nap"} {
		j, err := a.SubmitJob(ctx, api.JobRequest{Tribes: []string{"t"}, Plugin: "exec", Method: "run", Args: json.RawMessage(`{"command":"` + cmd + `"}`)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	waitFor(t, "the second job stored on b, not waiting for the first to end", func() bool {
		_, ok := b.replica.Get(jobKey(ids[1]))
		return ok && !b.jobs.isHanded(jobKey(ids[1]))
	})
	if first, _ := b.ownAck(ids[0]); first.State != jobs.Running {
		t.Fatalf("the first job is %s, want running", first.State)
	}
	if second, ok := b.ownAck(ids[1]); ok {
		t.Fatalf("the second job is %s, want queued behind the first (no ack yet)", second.State)
	}
	if n := b.jobs.handUnstored.Load() + b.jobs.handRefused.Load(); n != 0 {
		t.Fatalf("%d hand-offs refused or left unstored", n)
	}
}

// openKeys is what n's job loop decides on at its next step.
func openKeys(n *Node) []string {
	n.jobs.mu.Lock()
	defer n.jobs.mu.Unlock()
	return slices.Sorted(maps.Keys(n.jobs.open))
}

// The job loop decides only on jobs not settled: once its jobs are done,
// a target holds none open, nor does a writer that was not a target; a
// parallel job stays open on both (a queued job may follow it); a later
// job still runs; a job put back (the minute's rebuild from the state)
// settles again at the next step, without running again.
func TestOpenJobsAreTheUnsettled(t *testing.T) {
	ctx := context.Background()
	a, b := writerAndTarget(t, "echo", func(*Config) {})
	submit := func(parallel bool) string {
		t.Helper()
		j, err := a.SubmitJob(ctx, api.JobRequest{Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Args: json.RawMessage(`1`), Parallel: parallel})
		if err != nil {
			t.Fatal(err)
		}
		return j.ID
	}
	var ids []string
	for range 3 {
		ids = append(ids, submit(false))
	}
	par := submit(true)
	for _, id := range append(ids, par) {
		waitFor(t, "job "+id+" done", func() bool { return jobState(t, a, id).State == "done" })
	}
	waitFor(t, "b's open jobs: the parallel one alone", func() bool { return slices.Equal(openKeys(b), []string{jobKey(par)}) })
	waitFor(t, "a (not a target) holds the parallel job alone open", func() bool { return slices.Equal(openKeys(a), []string{jobKey(par)}) })

	later := submit(false)
	waitFor(t, "a later job done", func() bool { return jobState(t, a, later).State == "done" })
	waitFor(t, "b's open jobs: the parallel one alone again", func() bool { return slices.Equal(openKeys(b), []string{jobKey(par)}) })

	b.openAll()
	if got := len(openKeys(b)); got != 5 {
		t.Fatalf("after the rebuild b holds %d jobs open, want all 5", got)
	}
	b.jobs.pokeLoop()
	waitFor(t, "the rebuilt jobs settled again", func() bool { return slices.Equal(openKeys(b), []string{jobKey(par)}) })
	if st := jobState(t, a, ids[0]); st.State != "done" || st.Targets[0].Attempts != 1 {
		t.Fatalf("a settled job after the rebuild: %+v", st)
	}
}

// An ack handed to a job stream just as the stream stopped waiting for it
// is not lost: stopping the wait returns it, for the stream to deliver;
// once stopped, the stream is handed nothing more.
func TestAckHandedAsTheWaitEndsIsKept(t *testing.T) {
	var s jobSet
	ch := s.await("j")
	ack := &gossip.Signed{}
	if !s.answer("j", ack) {
		t.Fatal("answer found no stream waiting")
	}
	if got := s.stopWaiting("j", ch); got != ack {
		t.Fatalf("stopping the wait returned %v, not the ack handed meanwhile", got)
	}
	if s.answer("j", ack) {
		t.Fatal("answer handed an ack to a stream that stopped waiting")
	}
	if got := s.stopWaiting("k", s.await("k")); got != nil {
		t.Fatalf("a wait that got nothing returned %v", got)
	}
}

// A job whose plugin this node has not loaded yet, though the state asks
// it to (the job came with the plugin's entry, or just after a restart),
// loads it and runs, rather than failing as if it never could.
func TestJobLoadsItsPluginIfTheLoopHasNotYet(t *testing.T) {
	a, b := writerAndTarget(t, "echo", func(*Config) {})
	b.plugins.closeAll() // as if the plugin loop had not caught up
	j, e := writeEchoJob(t, a, b, "t")
	if err := b.replica.Apply(e); err != nil {
		t.Fatal(err)
	}
	if res := b.callJob(j); !res.OK {
		t.Fatalf("the job on b: %+v", res)
	}
}

// writeEchoJob writes on a, as SubmitJob does, an echo job to b (of
// tribes, if any), and hands it to no one.
func writeEchoJob(t *testing.T, a, b *Node, tribes ...string) (*jobs.Job, *gossip.Signed) {
	t.Helper()
	now := a.now().UTC()
	j := &jobs.Job{ID: a.newJobID(), Tribes: tribes, Plugin: "echo", Method: "echo", Args: json.RawMessage(`1`), Created: now, Expires: now.Add(time.Hour)}
	j.SetTargets([]string{b.ID().String()})
	raw, _ := json.Marshal(j)
	e, err := a.replica.PutQuiet(context.Background(), jobKey(j.ID), raw)
	if err != nil {
		t.Fatal(err)
	}
	return j, e
}

// A tribe job runs only on the plugin loaded for one of its tribes, not
// on one another tribe of the target loaded: here echo is loaded for t,
// and b is a member of u too, which did not load it.
func TestTribeJobNotAuthorisedThroughAnotherTribe(t *testing.T) {
	a, b := writerAndTarget(t, "echo", func(*Config) {})
	ctx := context.Background()
	if _, err := a.CreateTribe(ctx, "u"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Join(ctx, "u", []string{"b"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b a member of u", func() bool { return b.isMember("u", b.ID()) })
	for _, tribes := range [][]string{{"u"}, {"v"}} {
		j, _ := writeEchoJob(t, a, b, tribes...)
		if _, err := b.authorizeJob(a.ID(), j); err == nil {
			t.Errorf("a job of tribe %v authorised on b through t's echo", tribes)
		}
	}
	for _, tribes := range [][]string{{"t"}, {"u", "t"}, nil} {
		j, _ := writeEchoJob(t, a, b, tribes...)
		if _, err := b.authorizeJob(a.ID(), j); err != nil {
			t.Errorf("a job of tribes %v: %v", tribes, err)
		}
	}
}

// The collection removes the outputs of jobs that are gone, and the
// temporary files a crash left between an output's write and its rename;
// those of a live job stay.
func TestCollectionRemovesLeftoverOutputs(t *testing.T) {
	a, b := writerAndTarget(t, "echo", func(*Config) {})
	live, _ := writeEchoJob(t, a, b, "t")
	if err := os.MkdirAll(a.jobDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	gone := "19ab3c5e2f1-a1b2c3d4"
	files := map[string]bool{ // name: kept
		gone + ".out": false, gone + ".out.tmp": false,
		live.ID + ".out": true, live.ID + ".out.tmp": true,
	}
	for name := range files {
		if err := os.WriteFile(filepath.Join(a.jobDir(), name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a.collectJobs()
	for name, kept := range files {
		if _, err := os.Stat(filepath.Join(a.jobDir(), name)); (err == nil) != kept {
			t.Errorf("%s: kept %v, want %v", name, err == nil, kept)
		}
	}
}

// An ack taken from a member that joined a tribe of an include-new job
// counts for the job after that member leaves the tribe: it ran the job
// (or failed it) while a member.
func TestIncludeNewAckCountsAfterItsAuthorLeaves(t *testing.T) {
	a, nodes := trustedFleet(t, "b", "c")
	b, c := nodes["b"], nodes["c"]
	jobTribe(t, a, "t", "echo", []*Node{b})
	ctx := context.Background()
	j, err := a.SubmitJob(ctx, api.JobRequest{Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Args: json.RawMessage(`1`), IncludeNew: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Join(ctx, "t", []string{"c"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "c, a new member, to ack the job on the writer", func() bool {
		return targetStates(jobState(t, a, j.ID))["c"] == "done"
	})
	if _, err := a.Leave(ctx, "t", []string{"c"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "c no member on the writer", func() bool { return !a.isMember("t", c.ID()) })
	if st := targetStates(jobState(t, a, j.ID)); st["c"] != "done" || len(st) != 2 {
		t.Fatalf("after c left the tribe: %v, want b and c", st)
	}
}
