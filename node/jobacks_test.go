package node

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/plugins/jobs"
)

func TestAckFetchBackoff(t *testing.T) {
	var f ackFetches
	t0 := time.Unix(1000, 0)
	for _, s := range []struct {
		at   time.Duration
		want bool
	}{
		{0, true},                               // first ask
		{ackFetchEvery - time.Second, false},    // too soon
		{ackFetchEvery, true},                   // due; next in 2x
		{3*ackFetchEvery - time.Second, false},  // 2x not yet passed
		{3 * ackFetchEvery, true},               // next in 4x
		{7*ackFetchEvery - time.Second, false},  //
		{7 * ackFetchEvery, true},               // and so on, up to ackFetchMax
		{7*ackFetchEvery + 2*ackFetchMax, true}, //
		{8*ackFetchEvery + 3*ackFetchMax, true}, // capped: ackFetchMax later is due
		{8*ackFetchEvery + 3*ackFetchMax + time.Second, false},
	} {
		if got := f.ask("k", t0.Add(s.at)); got != s.want {
			t.Fatalf("ask at +%v: %v, want %v", s.at, got, s.want)
		}
	}
	f.wrote("jobs/a")
	f.wrote("jobs/b")
	f.drop(map[string]bool{"jobs/a": true}, map[string]bool{})
	if got := f.jobs(); len(got) != 1 || got[0] != "jobs/b" || len(f.due) != 0 {
		t.Fatalf("after drop: jobs %v, due %v", got, f.due)
	}
}

// With a trust list, a job's acks are kept by their targets and the
// writer only: anti-entropy between the targets, or from the writer,
// leaves others' acks out. A node asked for the job's status fetches them
// from the writer; the writer, missing one, asks its target for it; and
// once the job is collected every node forgets the acks it held.
func TestAcksKeptByTheirTargetsAndTheWriter(t *testing.T) {
	ctx := context.Background()
	a, b, c, d, j := trustedJobDone(t)
	ackB, ackC := ackKey(j.ID, b.ID()), ackKey(j.ID, c.ID())

	// Anti-entropy every way: b and c keep their own acks only.
	for _, pair := range [][2]*Node{{b, c}, {c, b}, {b, a}, {c, a}, {d, a}, {d, b}, {a, b}, {a, c}} {
		waitFor(t, "connected", func() bool {
			return pair[0].isConnected(pair[1].ID()) || pair[0].host.Connect(ctx, pair[1].host.Peerstore().PeerInfo(pair[1].ID())) == nil
		})
		if _, err := pair[0].replica.SyncWith(ctx, pair[1].ID()); err != nil {
			t.Fatalf("%s pulling from %s: %v", pair[0].cfg.Name, pair[1].cfg.Name, err)
		}
	}
	held := func(n *Node, key string) bool { _, ok := n.replica.Get(key); return ok }
	for _, h := range []struct {
		n        *Node
		key      string
		want     bool
		whatWhom string
	}{
		{a, ackB, true, "the writer, b's ack"}, {a, ackC, true, "the writer, c's ack"},
		{b, ackB, true, "b, its own ack"}, {b, ackC, false, "b, c's ack"},
		{c, ackC, true, "c, its own ack"}, {c, ackB, false, "c, b's ack"},
		{d, ackB, false, "d, b's ack"},
	} {
		if got := held(h.n, h.key); got != h.want {
			t.Errorf("%s: held %v, want %v", h.whatWhom, got, h.want)
		}
	}

	// Asked, d shows the job as the writer knows it.
	if s := jobState(t, d, j.ID); s.State != "done" || s.Counts["done"] != 2 {
		t.Fatalf("the job as d shows it, asked: %+v", s)
	}

	// The writer lost b's ack (as when b published it while a was down):
	// it asks b for it, and no sooner than the backoff again.
	if err := a.replica.Forget(ackB); err != nil {
		t.Fatal(err)
	}
	a.collectJobs() // as the loop does each minute: the job is pending again, followed
	a.fetchMissingAcks()
	if !held(a, ackB) || a.jobs.acksFetched.Load() != 1 {
		t.Fatalf("the writer fetched %d acks; holds b's: %v", a.jobs.acksFetched.Load(), held(a, ackB))
	}
	a.replica.Forget(ackB)
	a.fetchMissingAcks()
	if held(a, ackB) {
		t.Fatal("the writer asked b again within the backoff")
	}
	if _, err := a.replica.FetchKeys(ctx, b.ID(), ackB); err != nil {
		t.Fatal(err)
	}

	// Collected: every node forgets the acks it held, its own included.
	if _, err := a.replica.Delete(ctx, jobKey(j.ID)); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*Node{b, c, d} {
		waitFor(t, "the job gone on "+n.cfg.Name, func() bool {
			if _, ok := n.replica.Get(jobKey(j.ID)); ok {
				return false
			}
			_, err := n.replica.SyncWith(ctx, a.ID())
			return err == nil && !held(n, jobKey(j.ID))
		})
	}
	for _, n := range []*Node{a, b, c, d} {
		n.collectJobs()
		for _, k := range []string{ackB, ackC} {
			if _, ok := n.replica.Version(k); ok {
				t.Errorf("%s still holds %s (or its tombstone) after the job was collected", n.cfg.Name, k)
			}
		}
	}
}

// trustedFleet starts a, the trusted writer, and a node of each of names
// joining it and admitted, all with periodic anti-entropy off.
func trustedFleet(t *testing.T, names ...string) (a *Node, others map[string]*Node) {
	t.Helper()
	ac := loopbackConfig(t, "a")
	ac.Trusted = []string{identity(t, ac).String()}
	ac.SyncInterval = time.Hour
	a = startNode(t, ac)
	others = map[string]*Node{}
	for _, name := range names {
		c := loopbackConfig(t, name)
		c.Trusted, c.Join, c.SyncInterval = ac.Trusted, []string{tcpAddr(a)}, time.Hour
		others[name] = startNode(t, c)
	}
	waitFor(t, "a to know every node", func() bool { return len(a.nodeRecords()) == len(names)+1 })
	if _, err := a.Admit(context.Background(), api.AdmitRequest{AllPending: true}); err != nil {
		t.Fatal(err)
	}
	for _, n := range others {
		waitFor(t, n.cfg.Name+" admitted on "+n.cfg.Name, func() bool { return n.rules().Counts(n.ID()) })
	}
	return a, others
}

// A writer that lost an ack (as when its target published it while the
// writer was down) asks the target for it by itself, within
// ackFetchEvery.
func TestWriterAsksForAMissedAck(t *testing.T) {
	a, b, j := jobDoneOnB(t)
	if err := a.replica.Forget(ackKey(j.ID, b.ID())); err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	// The fetch counts what it applied after it returns: the ack can be
	// back a moment before the count (seen on a loaded machine).
	waitFor(t, "the writer to fetch the ack again", func() bool {
		_, ok := a.replica.Get(ackKey(j.ID, b.ID()))
		return ok && a.jobs.acksFetched.Load() > 0
	})
	t.Logf("fetched %v after it was lost", time.Since(lost).Round(time.Millisecond))
	if got := a.jobs.acksFetched.Load(); got != 1 {
		t.Fatalf("%d acks fetched, want 1", got)
	}
}

// trustedJobDone is a trusted fleet (trustedFleet) of a, b, c and d, and
// a job a wrote to tribe t of b and c (echo loaded), done on a.
// jobDoneOnB is a trusted writer a, an admitted b, and a job of a's to
// tribe t of b alone, done.
func jobDoneOnB(t *testing.T) (a, b *Node, j api.Job) {
	t.Helper()
	a, nodes := trustedFleet(t, "b")
	b = nodes["b"]
	jobTribe(t, a, "t", "echo", []*Node{b})
	j, err := a.SubmitJob(context.Background(), api.JobRequest{Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Args: json.RawMessage(`1`)})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job done on the writer", func() bool { return jobState(t, a, j.ID).State == "done" })
	return a, b, j
}

func trustedJobDone(t *testing.T) (a, b, c, d *Node, j api.Job) {
	t.Helper()
	a, nodes := trustedFleet(t, "b", "c", "d")
	b, c, d = nodes["b"], nodes["c"], nodes["d"]
	jobTribe(t, a, "t", "echo", []*Node{b, c})
	j, err := a.SubmitJob(context.Background(), api.JobRequest{Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Args: json.RawMessage(`1`)})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job done on the writer", func() bool { return jobState(t, a, j.ID).State == "done" })
	return a, b, c, d, j
}

// A trusted writer that is trusted no more (its trust list reloaded
// without it) forgets the acks other nodes wrote: they travel only to
// trusted writers.
func TestDemotedWriterForgetsOthersAcks(t *testing.T) {
	a, b, c, _, j := trustedJobDone(t)
	for _, target := range []*Node{b, c} {
		if _, ok := a.replica.Get(ackKey(j.ID, target.ID())); !ok {
			t.Fatalf("the writer holds no ack of %s", target.cfg.Name)
		}
	}
	other := "12D3KooWPjceQrSwdWXPyLLeABRXmuqt69Rg3sBYbU1Nft9HyQ6X"
	id, err := peer.Decode(other)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.setTrust(gossip.NewTrust(id)); err != nil {
		t.Fatal(err)
	}
	a.forgetOthersAcks() // as a reload does once it has taken the new list
	for _, e := range a.replica.Prefix(jobsPrefix) {
		if strings.Contains(e.Key, "/acks/") {
			t.Errorf("a demoted writer still holds %s", e.Key)
		}
	}
}

// A target answers the job's writer with its final ack as soon as it is
// signed, and stores its own copy with its next commit: one disk sync a
// job (the job with its running ack), not two. The copy is stored within
// a second when no commit comes.
func TestTargetSyncsOnceAJob(t *testing.T) {
	a, b, _, _, _ := trustedJobDone(t)
	const n = 12
	before := b.replica.StoreCommits()
	var last api.Job
	for range n {
		j, err := a.SubmitJob(context.Background(), api.JobRequest{Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Args: json.RawMessage(`1`)})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the job done on the writer", func() bool { return jobState(t, a, j.ID).State == "done" })
		last = j
	}
	key := ackKey(last.ID, b.ID())
	waitFor(t, "b to store its last ack", func() bool {
		st := gossip.NewState(b.replica.Trust())
		if _, _, err := gossip.LoadState(b.store, st, nil); err != nil {
			t.Fatal(err)
		}
		e, ok := st.Get(key)
		return ok && strings.Contains(string(e.Value), `"done"`)
	})
	// Besides the n jobs, the last ack's own commit, and room for what
	// else the node stores meanwhile (its record, peers' entries); two
	// syncs a job made 2n+1.
	if got := b.replica.StoreCommits() - before; got > n+n/2 {
		t.Errorf("b made %d commits for %d jobs; want about one a job", got, n)
	}
}

// A writer asks for a missing ack a target whose node record it did not
// hold when it last read the job (a job's kept row names such a target by
// its hash), once the record is back: the record changes no ack, so the
// row is not made again.
func TestWriterAsksATargetKnownLater(t *testing.T) {
	ctx := context.Background()
	a, b, _, _, j := trustedJobDone(t)
	ackB, recB := ackKey(j.ID, b.ID()), nodesPrefix+b.ID().String()
	if err := a.replica.Forget(ackB, recB); err != nil {
		t.Fatal(err)
	}
	a.collectJobs() // the row made with b unknown: pending, b by its hash
	if _, err := a.replica.FetchKeys(ctx, b.ID(), recB); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.targetByHash(jobs.TargetHash(b.ID().String())); !ok {
		t.Fatal("a does not know b again")
	}
	a.fetchMissingAcks()
	if _, ok := a.replica.Get(ackB); !ok {
		t.Fatalf("the writer did not ask b for its ack (fetched %d)", a.jobs.acksFetched.Load())
	}
}

// An admitted node that is no target of a job signs acks of it as itself
// (a node not admitted is refused before: gossip.ErrNotAdmitted): pushed to the writer, published,
// or of a job that does not exist, each is refused and counted, and the
// job stays done (a forged failed ack turned it failed, a running one
// kept it pending, and the writer held every ack the stranger wrote).
func TestAckFromANonTargetRefused(t *testing.T) {
	ctx := context.Background()
	a, _, j := jobDoneOnB(t)
	sc := loopbackConfig(t, "stranger")
	sc.Trusted, sc.Join, sc.SyncInterval = a.cfg.Trusted, []string{tcpAddr(a)}, time.Hour
	s := startNode(t, sc)
	waitFor(t, "a holds the stranger's record", func() bool { _, ok := a.replica.Get(nodesPrefix + s.ID().String()); return ok })
	if _, err := a.Admit(ctx, api.AdmitRequest{Nodes: []string{s.ID().String()}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stranger admitted", func() bool { return a.rules().Counts(s.ID()) })
	var keys []string
	for i, c := range []struct{ job, value string }{
		{j.ID, `{"state":"failed","error":"forged"}`},
		{j.ID, `{"state":"running","attempts":1}`},
		{"19ab3c5e2f1-a1b2c3d4", `{"state":"done"}`}, // no such job
	} {
		e, err := s.replica.PutQuiet(ctx, ackKey(c.job, s.ID()), []byte(c.value))
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, e.Key)
		if err := s.replica.Push(ctx, a.ID(), e); err == nil {
			t.Errorf("push %d taken", i)
		}
		if got := a.jobs.ackRefused.Load(); got != int64(i+1) {
			t.Fatalf("after push %d: %d acks refused, want %d", i, got, i+1)
		}
	}
	// By pubsub: the last version of the stranger's ack of the job.
	e, _ := s.replica.Get(keys[1])
	s.replica.Announce(ctx, e)
	waitFor(t, "the published ack refused", func() bool { return a.jobs.ackRefused.Load() == 4 })
	if got := a.rejected()["job_ack_refused"]; got != 4 {
		t.Errorf("job_ack_refused %d, want 4", got)
	}
	for _, k := range keys {
		if _, ok := a.replica.Version(k); ok {
			t.Errorf("the writer holds %s", k)
		}
	}
	if st := jobState(t, a, j.ID); st.State != "done" || len(st.Targets) != 1 {
		t.Errorf("state %q counts %v", st.State, st.Counts)
	}
	// One that got in anyway (stored by an earlier version) counts for
	// nothing either: not in the job's state, its list row, its wait.
	{
		e, _ := s.replica.Get(keys[0]) // the stranger's latest ack of the job
		if err := a.replica.Apply(e); err != nil {
			t.Fatal(err)
		}
		if st := jobState(t, a, j.ID); st.State != "done" || len(st.Targets) != 1 {
			t.Errorf("with %s held: state %q counts %v", e.Value, st.State, st.Counts)
		}
		if list := a.localJobs(""); len(list) != 1 || list[0].State != "done" {
			t.Errorf("with %s held: the list says %+v", e.Value, list)
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := a.WaitJob(wctx, j.ID, func(*api.JobTarget) {})
		if err != nil || wctx.Err() != nil {
			t.Errorf("with %s held: the wait did not end (%v)", e.Value, err)
		}
		cancel()
	}
}

// A status asked on a node that is not connected to the job's writer (which
// holds the targets' acks) dials the writer and shows what it knows; with
// the writer down, the status says this node may be behind, rather than
// showing a target that ran the job as silently pending.
func TestJobStatusAsksAWriterNotConnected(t *testing.T) {
	a, b, c, d, j := trustedJobDone(t)
	ctx := context.Background()
	d.host.Network().ClosePeer(a.ID())
	if d.isConnected(a.ID()) {
		t.Fatal("d still connected to the writer")
	}
	// The first ask dials the writer and pulls the job from it; its acks
	// may come with a later ask on a loaded machine (each within 2 s).
	if _, err := d.Job(ctx, j.ID); err != nil {
		t.Fatalf("on d, not connected to the writer: %v", err)
	}
	waitFor(t, "d to show the job done, as the writer does", func() bool {
		s, err := d.Job(ctx, j.ID)
		return err == nil && s.State == "done" && s.Behind == ""
	})

	// c holds its own ack, not b's: b's comes only from the writer.
	a.Close()
	waitFor(t, "c to see the writer gone", func() bool { return !c.isConnected(a.ID()) })
	s, err := c.Job(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if s.State != "pending" || !strings.Contains(s.Behind, "could not be reached") {
		t.Fatalf("on c, the writer down: %s (behind: %q), want pending and why c may be behind", s.State, s.Behind)
	}
	if st := targetStates(s); st["c"] != "done" || st["b"] != "pending" {
		t.Fatalf("on c: %v", st)
	}
	if s, _ := b.Job(ctx, j.ID); s.Behind == "" {
		t.Fatal("b, the writer down, does not say it may be behind")
	}
}

// With a trust list, an ack whose job's writer is out of reach is not
// published: it would reach every peer on the state topic, strangers
// too, with the head of the job's output. It waits for the writer (or
// goes to another trusted writer in reach).
func TestAckNotPublishedWithATrustList(t *testing.T) {
	ac := loopbackConfig(t, "a")
	ac.Trusted = []string{identity(t, ac).String()}
	a := startNode(t, ac)
	bc, cc := loopbackConfig(t, "b"), loopbackConfig(t, "c")
	for _, c := range []*Config{&bc, &cc} {
		c.Trusted, c.Join = ac.Trusted, []string{tcpAddr(a)}
	}
	bc.Exec = plugins.ExecConfig{Commands: map[string]plugins.Command{"nap": {Argv: []string{"sleep", "3"}}}}
	b, c := startNode(t, bc), startNode(t, cc)
	waitFor(t, "a to know b and c", func() bool { return len(a.nodeRecords()) == 3 })
	if _, err := a.Admit(context.Background(), api.AdmitRequest{AllPending: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "c to connect to b", func() bool {
		c.host.Connect(context.Background(), peer.AddrInfo{ID: b.ID(), Addrs: b.host.Addrs()})
		return c.isConnected(b.ID()) && b.rules().Counts(b.ID()) && c.rules().Counts(b.ID())
	})
	jobTribe(t, a, "t", "exec", []*Node{b})
	j, err := a.SubmitJob(context.Background(), api.JobRequest{Tribes: []string{"t"}, Plugin: "exec", Method: "run", Args: json.RawMessage(`{"command":"nap"}`)})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job running on b, as the writer sees it", func() bool { return targetStates(jobState(t, a, j.ID))["b"] == "running" })
	a.Close()
	waitFor(t, "b's final ack kept for the writer", func() bool { return b.jobs.acksHeld.Load() == 1 })
	if n := b.jobs.acksPublished.Load(); n != 0 {
		t.Fatalf("%d acks published", n)
	}
	if !c.isConnected(b.ID()) {
		t.Log("c is no longer connected to b: what it would have got by pubsub is not shown")
	}
	if _, ok := c.replica.Get(ackKey(j.ID, b.ID())); ok || c.jobs.ackRefused.Load() != 0 {
		t.Fatal("b's ack reached c, which is no trusted writer")
	}
}
