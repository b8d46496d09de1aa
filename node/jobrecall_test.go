package node

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins/jobs"
)

// A target whose state was lost while it kept its identity gets back from
// the writer the ack it wrote of a job before it decides on the job again:
// it does not run the job a second time, and the writer's status is
// unchanged. Lost: its state.db deleted (the job comes back by
// anti-entropy, without the ack); rolled back: the state kept the job but
// not the ack (a snapshot taken between the two), so the job loop meets
// the job at once, before any peer is connected; killed after it
// answered: the state holds the running ack, as a target's does that was
// killed after it sent the writer its final ack and before its own copy
// was stored (a final ack is stored with the next commit, see PutAck).
func TestLostStateDoesNotRunAJobAgain(t *testing.T) {
	for _, lose := range []struct {
		name string
		do   func(t *testing.T, c Config, ran *gossip.Signed, key crypto.PrivKey)
	}{
		{"lost", func(t *testing.T, c Config, _ *gossip.Signed, _ crypto.PrivKey) {
			if err := os.Remove(filepath.Join(c.DataDir, gossip.StoreFile)); err != nil {
				t.Fatal(err)
			}
		}},
		{"rolled back", func(t *testing.T, c Config, ran *gossip.Signed, _ crypto.PrivKey) {
			st, err := gossip.OpenStore(filepath.Join(c.DataDir, gossip.StoreFile), false)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if err := st.Delete(ran.Key); err != nil {
				t.Fatal(err)
			}
		}},
		{"killed after it answered", func(t *testing.T, c Config, ran *gossip.Signed, key crypto.PrivKey) {
			st, err := gossip.OpenStore(filepath.Join(c.DataDir, gossip.StoreFile), false)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			raw, _ := json.Marshal(jobs.Ack{State: jobs.Running, Attempts: 1, Started: time.Now()})
			running, err := gossip.Sign(gossip.Entry{Key: ran.Key, Value: raw, HLC: ran.HLC - 1}, key)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Put(running); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(lose.name, func(t *testing.T) {
			a, b, _, _, j := trustedJobDone(t)
			ran, ok := a.replica.Get(ackKey(j.ID, b.ID()))
			if !ok {
				t.Fatal("the writer holds no ack of b")
			}

			bc, key := b.cfg, b.host.Peerstore().PrivKey(b.ID())
			b.Close()
			lose.do(t, bc, ran, key)
			b2 := startNode(t, bc)
			if b2.ID() != b.ID() {
				t.Fatal("b restarted with another identity")
			}
			waitFor(t, "b to hold the job again", func() bool { _, ok := b2.replica.Get(jobKey(j.ID)); return ok })
			waitFor(t, "b to hold a final ack of it again", func() bool { a, ok := b2.ownAck(j.ID); return ok && a.State.Final() })
			// Its loop steps at every change of its ack.
			waitFor(t, "b's job loop to settle the job", func() bool {
				b2.jobs.mu.Lock()
				defer b2.jobs.mu.Unlock()
				return !b2.jobs.open[jobKey(j.ID)]
			})
			if got, _ := b2.replica.Get(b2.ownAckKey(j.ID)); got.Hash != ran.Hash {
				a, _ := b2.ownAck(j.ID)
				t.Fatalf("b holds another ack than the one it wrote before (ran again?): %+v", a)
			}
			if got, _ := a.replica.Get(ackKey(j.ID, b.ID())); got.Hash != ran.Hash {
				t.Fatal("the writer's ack of b changed")
			}
			if n := b2.jobs.recall.gaveUp.Load(); n != 0 {
				t.Fatalf("%d jobs decided on without asking the writer", n)
			}
		})
	}
}

// Which jobs a node asks a writer about: those written before it started
// (or within the clock skew after), that it may have acknowledged (a
// target, or a job that takes new members), that it holds no final ack of
// (none, or a running one a snapshot kept) and has not asked about yet.
func TestUnrecalled(t *testing.T) {
	a, nodes := trustedFleet(t, "b")
	b := nodes["b"]
	old := b.started.Add(-time.Hour)
	mk := func(id string, created time.Time, target bool, includeNew bool) *jobs.Job {
		j := &jobs.Job{ID: id, Tribes: []string{"t"}, Plugin: "echo", Method: "echo", Created: created, Expires: created.Add(48 * time.Hour), IncludeNew: includeNew}
		if target {
			j.SetTargets([]string{b.ID().String()})
		} else {
			j.SetTargets([]string{a.ID().String()})
		}
		return j
	}
	live := []*jobs.Job{
		mk("old-target", old, true, false),
		mk("old-include-new", old, false, true),
		mk("old-not-target", old, false, false),
		mk("skewed", b.started.Add(gossip.MaxClockSkew/2), true, false),
		mk("new", b.started.Add(2*gossip.MaxClockSkew), true, false),
		mk("asked", old, true, false),
		mk("acked", old, true, false),
		mk("running", old, true, false),
	}
	b.jobs.recall.check("asked")
	for id, st := range map[string]jobs.State{"acked": jobs.Done, "running": jobs.Running} {
		raw, _ := json.Marshal(jobs.Ack{State: st, Attempts: 1})
		if _, err := b.replica.PutQuiet(context.Background(), b.ownAckKey(id), raw); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, j := range b.unrecalled(live) {
		got = append(got, j.ID)
	}
	want := []string{"old-target", "old-include-new", "skewed", "running"}
	if len(got) != len(want) {
		t.Fatalf("unrecalled %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("unrecalled %v, want %v", got, want)
		}
	}
}

// A target that crashes (Node.Crash, which stores nothing more, as a
// killed process) right after it answered the writer with its done ack,
// before that ack reached its own store, gets the ack back from the
// writer when it starts again and runs nothing a second time.
func TestTargetCrashedBeforeItStoredItsAck(t *testing.T) {
	a, b, _, _, _ := trustedJobDone(t)
	bc := b.cfg
	for attempt := 0; ; attempt++ {
		if attempt == 5 {
			t.Fatalf("b stored its ack before each of %d crashes made within a second of it", attempt)
		}
		j, err := a.SubmitJob(context.Background(), api.JobRequest{Nodes: []string{"b"}, Plugin: "echo", Method: "echo", Args: json.RawMessage(`1`)})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the job done on the writer", func() bool { return jobState(t, a, j.ID).State == "done" })
		ran, _ := a.replica.Get(ackKey(j.ID, b.ID()))
		if err := b.Crash(); err != nil {
			t.Fatal(err)
		}
		st, err := gossip.OpenStore(filepath.Join(bc.DataDir, gossip.StoreFile), false)
		if err != nil {
			t.Fatal(err)
		}
		kept := gossip.NewState(gossip.NewTrust())
		_, _, err = gossip.LoadState(st, kept, nil)
		st.Close()
		if err != nil {
			t.Fatal(err)
		}
		b = startNode(t, bc)
		if e, ok := kept.Get(ran.Key); ok && e.Hash == ran.Hash {
			continue // its next commit came before the crash: try again
		}
		waitFor(t, "b to hold a final ack again", func() bool { a, ok := b.ownAck(j.ID); return ok && a.State.Final() })
		if got, _ := b.replica.Get(b.ownAckKey(j.ID)); got.Hash != ran.Hash {
			a, _ := b.ownAck(j.ID)
			t.Fatalf("b holds another ack than the one it answered with (ran again?): %+v", a)
		}
		if n := b.jobs.recall.gaveUp.Load(); n != 0 {
			t.Fatalf("%d jobs decided on without asking the writer", n)
		}
		return
	}
}

// A node asks the job's writer for its own ack even when it is not
// connected to it: it dials the writer (a node that started less than
// gossip.MaxClockSkew before a job recalls before it runs it, and one that
// got the job by pubsub is seldom connected to the writer; waiting for a
// connection held such jobs for seconds).
func TestRecallDialsTheWriter(t *testing.T) {
	a, b, _, _, j := trustedJobDone(t)
	bj, ok := b.replica.Get(jobKey(j.ID))
	if !ok {
		t.Fatal("b holds no job")
	}
	job, _, err := b.job(bj)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.replica.Forget(ackKey(j.ID, b.ID())); err != nil { // as if lost
		t.Fatal(err)
	}
	b.host.Network().ClosePeer(a.ID())
	if left := b.recallOnce([]*jobs.Job{job}, map[peer.ID]bool{}); len(left) != 0 {
		t.Fatalf("b could not ask a, not connected, about %d job(s)", len(left))
	}
	if ack, ok := b.ownAck(j.ID); !ok || ack.State != jobs.Done {
		t.Fatalf("b's own ack after the recall: %+v %v; want done, from a", ack, ok)
	}
}
