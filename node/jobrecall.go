package node

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/plugins/jobs"
)

// A target's own ack is its journal of a job (jobs.go), kept in its state.
// A node whose state was lost or rolled back while its identity key was
// kept (a state.db deleted after corruption, a VM snapshot restored) no
// longer holds the acks that earlier runs of it wrote, and would run those
// jobs again, or call them expired over a done; anti-entropy does not
// bring the acks back, as they are direct entries that travel only to
// trusted writers. So before it decides on a job it may have acknowledged
// before this process started, and holds no final ack of (a snapshot taken
// mid-run keeps a running one, which would be found interrupted, or run
// again), a node asks the job's writer (or another trusted writer) for its
// own ack, by key: the writer's, if later, replaces the one held. A job
// written since the start needs no asking (every ack this process wrote is
// in its state), and neither does a job its writer handed to this node at
// submission (nobody has acknowledged it yet).

// ownAckRecall is what the job loop has asked writers about.
type ownAckRecall struct {
	mu      sync.Mutex
	checked map[string]bool // job ids asked about, given up on, or new when handed
	asking  bool            // a recall runs
	gaveUp  atomic.Int64    // jobs decided on unasked: no writer could be reached in time
}

// ownAckRecallWait bounds how long jobs wait for a writer to be asked:
// past it, a job no writer could be asked about is decided on as it is
// held (its writer may be down as long as the target was, and a job must
// still reach a target that comes back).
const ownAckRecallWait = 15 * time.Second

func (r *ownAckRecall) check(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.checked == nil {
		r.checked = map[string]bool{}
	}
	r.checked[id] = true
}

// prune forgets the jobs not in live (collectJobs).
func (r *ownAckRecall) prune(live map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	maps.DeleteFunc(r.checked, func(id string, _ bool) bool { return !live[id] })
}

// mayHaveAcked reports whether an earlier run of this node may have
// acknowledged j: written before it started (or up to gossip.MaxClockSkew
// after: the writer's clock may run ahead of this node's), to this node
// or to members that join.
func (n *Node) mayHaveAcked(j *jobs.Job) bool {
	return j.Created.Before(n.started.Add(gossip.MaxClockSkew)) && (j.Targeted(n.jobs.self) || j.IncludeNew)
}

// unrecalled are the jobs of live that an earlier run of this node may
// have acknowledged, that it holds no final ack of, and that it has not
// asked a writer about.
func (n *Node) unrecalled(live []*jobs.Job) []*jobs.Job {
	r := &n.jobs.recall
	var out []*jobs.Job
	for _, j := range live {
		if !n.mayHaveAcked(j) {
			continue
		}
		r.mu.Lock()
		checked := r.checked[j.ID]
		r.mu.Unlock()
		if checked {
			continue
		}
		if a, ok := n.ownAck(j.ID); ok && a.State.Final() {
			continue
		}
		out = append(out, j)
	}
	return out
}

// recallOwnAcks asks writers for this node's acks of js, unless a recall
// runs already; the job loop is poked when it ends.
func (n *Node) recallOwnAcks(js []*jobs.Job) {
	r := &n.jobs.recall
	r.mu.Lock()
	if r.asking {
		r.mu.Unlock()
		return
	}
	r.asking = true
	r.mu.Unlock()
	n.spawn(func() {
		defer func() {
			r.mu.Lock()
			r.asking = false
			r.mu.Unlock()
			n.jobs.pokeLoop()
		}()
		giveUp := time.Now().Add(ownAckRecallWait)
		tried := map[peer.ID]bool{}
		for left := js; ; {
			if left = n.recallOnce(left, tried); len(left) == 0 {
				return
			}
			if time.Now().After(giveUp) {
				for _, j := range left {
					r.check(j.ID)
				}
				r.gaveUp.Add(int64(len(left)))
				n.log.Info("no trusted writer could be asked whether this node ran these jobs before it started; deciding on them as this node holds them",
					"jobs", len(left), "waited", ownAckRecallWait)
				return
			}
			select {
			case <-n.ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	})
}

// recallOnce asks, for each job of js, a connected writer that may hold
// this node's ack of it, one it has not tried yet if there is one (a
// writer that failed is marked tried); it returns the jobs that no such
// writer could be asked about now.
func (n *Node) recallOnce(js []*jobs.Job, tried map[peer.ID]bool) (left []*jobs.Job) {
	r := &n.jobs.recall
	asked := map[peer.ID][]*jobs.Job{}
	for _, j := range js {
		w, any := n.recallFrom(j, tried)
		switch {
		case !any: // nobody but this node could hold it
			r.check(j.ID)
		case w == "":
			left = append(left, j)
		default:
			asked[w] = append(asked[w], j)
		}
	}
	for w, wjs := range asked {
		keys := make([]string, len(wjs))
		for i, j := range wjs {
			keys[i] = n.ownAckKey(j.ID)
		}
		ctx, cancel := context.WithTimeout(n.ctx, jobWriterSyncTimeout)
		st, err := n.replica.FetchKeys(ctx, w, keys...)
		cancel()
		if err != nil {
			n.log.Debug("asking a writer for this node's own acks", "writer", w, "err", err)
			tried[w] = true
			left = append(left, wjs...)
			continue
		}
		n.log.Debug("asked a writer for this node's own acks", "writer", w, "jobs", len(wjs), "got", st.Applied)
		for _, j := range wjs {
			r.check(j.ID)
		}
	}
	return left
}

// recallFrom picks whom to ask for this node's ack of j: its writer, else
// another trusted writer, one not in tried: a connected one first, else
// one it dials (learning its address from its record); a tried one again
// only if it is connected and nobody else can be asked. A node that
// started less than gossip.MaxClockSkew before a job was written recalls
// before it runs the job, unless the writer handed it the job; one that
// got it by pubsub is seldom connected to the writer, and waiting for a
// connection held such a job for seconds (9.7 s a job to 100 nodes in
// simulated time, TestSimTimeJobVsCall; up to ownAckRecallWait). any is
// false if no other node could hold the ack (this node wrote j and is the
// only trusted writer, or trust is open and this node wrote it).
func (n *Node) recallFrom(j *jobs.Job, tried map[peer.ID]bool) (w peer.ID, any bool) {
	self := n.host.ID()
	candidates := []peer.ID{n.jobWriter(j)}
	if t := n.replica.Trust(); !t.Open() {
		candidates = append(candidates, t.Peers()...)
	}
	var dial peer.ID
	for _, p := range candidates {
		if p == "" || p == self {
			continue
		}
		any = true
		connected := n.host.Network().Connectedness(p) == network.Connected
		switch {
		case connected && !tried[p]:
			return p, true
		case connected && w == "":
			w = p // tried before: asked again if no other can be asked
		case !connected && !tried[p] && dial == "":
			dial = p
		}
	}
	if dial != "" {
		n.learnRecordAddrs(dial)
		return dial, true
	}
	return w, any
}
