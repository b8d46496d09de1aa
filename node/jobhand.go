package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
)

// JobProtocol hands a new job to one of its targets and brings back the
// target's ack on the same stream when the run ends soon, as a call
// brings back its answer. The writer sends the job's signed entry and
// closes its side. The target takes it as it takes a push (the sender
// must have written it), answers one byte (1 taken, 0 refused) and then,
// once its own ack of the job is final and at most jobAnswerWait later,
// that ack's signed entry, or nothing: an ack that comes later goes to
// the writer by push (shareAck).
const JobProtocol = "/tribe/job/1.0.0"

const (
	// jobAnswerWait is how long a target holds a job stream for its
	// final ack: a run that ends within it answers like a call.
	jobAnswerWait = time.Second
	// jobHandTimeout bounds the rest of a job stream on either side.
	jobHandTimeout = 10 * time.Second
	// maxHanding and maxHandingPerPeer bound the job streams a node takes
	// at once: a writer hands each target one per job, and holds it about
	// as long as the run; more from one peer is a flood, refused at once
	// and counted (job_handoff_busy).
	maxHanding, maxHandingPerPeer = 256, 32
)

// deliverJob hands a new job straight to each of its targets this node is
// connected to, as a call's fan-out reaches them (bounded the same way);
// a target's ack comes back on the same stream. Only if one is not
// reached (not connected, down, the hand-off failed), or publish is set,
// is the job published, to reach the rest through pubsub and
// anti-entropy: published, a job cost every node of the fleet as much
// again as its targets' runs did. A node that is asked about a job it
// does not hold pulls from the trusted writers (jobByID).
func (n *Node) deliverJob(e *gossip.Signed, targets []string, publish bool) {
	var ids []peer.ID
	for _, t := range targets {
		id, err := peer.Decode(t)
		switch {
		case err != nil:
			publish = true // cannot happen: the targets are peer IDs
		case id == n.host.ID():
		case n.host.Network().Connectedness(id) == network.Connected:
			ids = append(ids, id)
		default:
			publish = true
		}
	}
	// CallParallel hand-offs at once; a target that took the job frees
	// its place for the next, and waits for its ack only while fewer than
	// 4 × CallParallel do (the others' acks come by push): a slow run
	// never slows the delivery to the rest.
	sem := make(chan struct{}, n.cfg.CallParallel)
	waits := make(chan struct{}, 4*n.cfg.CallParallel)
	var wg sync.WaitGroup
	var failed atomic.Bool
	for _, id := range ids {
		sem <- struct{}{}
		wg.Go(func() {
			var once sync.Once
			free := func() { once.Do(func() { <-sem }) }
			defer free()
			waiting := false
			err := n.handJob(id, e, func() bool {
				free()
				select {
				case waits <- struct{}{}:
					waiting = true
				default:
				}
				return waiting
			})
			if waiting {
				<-waits
			}
			if err != nil {
				failed.Store(true)
				if n.ctx.Err() == nil {
					n.log.Debug("handing a job to a target", "job", e.Key, "target", id, "err", err)
				}
			}
		})
	}
	wg.Wait()
	if publish || failed.Load() {
		n.jobs.jobsPublished.Add(1)
		n.replica.Announce(n.ctx, e)
	}
}

// handJob hands job e to target p and, if taken (called once p took the
// job) says to wait, takes the ack p answers with, as a push from p.
func (n *Node) handJob(p peer.ID, e *gossip.Signed, taken func() (wait bool)) error {
	ctx, cancel := context.WithTimeout(n.ctx, jobHandTimeout+jobAnswerWait)
	defer cancel()
	n.learnRecordAddrs(p)
	defer n.useCallConn(p)()
	s, err := n.host.NewStream(ctx, p, JobProtocol)
	if err != nil {
		return err
	}
	defer s.Close()
	if dl, ok := ctx.Deadline(); ok {
		s.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	if _, err := s.Write(e.Raw); err != nil {
		return err
	}
	s.CloseWrite()
	var took [1]byte
	if _, err := io.ReadFull(s, took[:]); err != nil {
		return fmt.Errorf("no answer: %w", err)
	}
	if took[0] != 1 {
		return errors.New("refused")
	}
	if !taken() {
		s.Reset() // so the target's answer fails, and it pushes its ack
		return nil
	}
	ack, err := io.ReadAll(io.LimitReader(s, gossip.MaxEntrySize+1))
	if err != nil || len(ack) == 0 {
		return nil // taken; the ack, if it was cut short, comes by push
	}
	if _, err := n.replica.Accept(p, ack); err != nil {
		return fmt.Errorf("its ack: %w", err)
	}
	return nil
}

// serveJob takes a job handed to this node and answers with this node's
// final ack of it, if there is one within jobAnswerWait.
func (n *Node) serveJob(s network.Stream) {
	from := s.Conn().RemotePeer()
	// Only a trusted writer can author a job (every peer, with no trust
	// list): anyone else is refused before it takes a slot, or strangers
	// could hold every slot and keep the writers' jobs out.
	if !n.replica.Trust().Trusted(from) {
		n.jobs.handRefused.Add(1)
		s.Reset()
		return
	}
	// As a push is taken: not from a peer in its sync cool-down (it sent
	// what no honest peer sends), and a few at a time.
	if n.replica.Penalised(from) || !n.jobs.handing.Acquire(from) {
		n.jobs.handBusy.Add(1)
		s.Reset()
		return
	}
	defer n.jobs.handing.Release(from)
	defer s.Close()
	dl := time.Now().Add(jobHandTimeout + jobAnswerWait)
	s.SetDeadline(dl)
	b, err := io.ReadAll(io.LimitReader(s, gossip.MaxEntrySize+1))
	if err != nil {
		s.Reset()
		return
	}
	e, err := n.replica.Check(from, b) // refusals are counted there
	if err == nil && !isJobKey(e.Key) {
		n.jobs.handRefused.Add(1)
		err = fmt.Errorf("%s is not a job", e.Key)
	}
	var id string
	var ch chan *gossip.Signed
	if err == nil {
		// Waiting before the job is stored: an ack written with it (as
		// expired) comes here, not by push as well.
		id = strings.TrimPrefix(e.Key, jobsPrefix)
		if j, _, err := n.job(e); err == nil && n.mayHaveAcked(j) {
			// Handed by its writer (Check took it from its author
			// only): a new job, which no earlier run of this node
			// can have acknowledged (jobrecall.go).
			n.jobs.recall.check(id)
		}
		ch = n.jobs.await(id)
		defer n.jobs.unawait(id, ch)
		err = n.keepHanded(e, dl.Add(-jobAnswerWait))
	}
	if err != nil {
		n.log.Debug("refused a job handed by a peer", "from", from, "err", err)
		s.Write([]byte{0})
		return
	}
	if _, err := s.Write([]byte{1}); err != nil {
		s.Reset()
		return
	}
	var ack *gossip.Signed
	if a, ok := n.ownAck(id); ok && a.State.Final() {
		ack, _ = n.replica.Get(n.ownAckKey(id))
	} else {
		t := time.NewTimer(jobAnswerWait)
		defer t.Stop()
		select {
		case ack = <-ch:
		case <-t.C:
		case <-n.ctx.Done():
		}
	}
	if ack == nil {
		ack = n.jobs.stopWaiting(id, ch)
	}
	if ack == nil {
		return
	}
	if _, err := s.Write(ack.Raw); err != nil {
		s.Reset()
		n.spawn(func() { n.shareAck(id, ack) })
	}
}

// handedJob is a job handed to this node, checked, on its way to the
// store.
type handedJob struct {
	e    *gossip.Signed
	done chan struct{}
	err  error
}

func (h *handedJob) stored(err error) {
	h.err = err
	close(h.done)
}

// keepHanded stores job e, handed by its writer, and returns once it is
// stored: by the job loop, with its running ack if it runs it at once (a
// target then syncs its disk once a job, as its final ack goes with the
// next commit; with 25 agents on one disk the syncs were most of a job's
// time), else alone. A job
// held here already, in any version, is stored at once: the state's rules
// say which version stands. Past by it gives up (the loop may still store
// the job, and run it: the writer, told it was refused, publishes it too).
func (n *Node) keepHanded(e *gossip.Signed, by time.Time) error {
	_, held := n.replica.Version(e.Key)
	s := &n.jobs
	s.mu.Lock()
	hj := s.handed[e.Key]
	switch {
	case held || (hj != nil && hj.e.Hash != e.Hash):
		s.mu.Unlock()
		return n.replica.Apply(e)
	case hj == nil:
		hj = &handedJob{e: e, done: make(chan struct{})}
		if s.handed == nil {
			s.handed = map[string]*handedJob{}
		}
		s.handed[e.Key] = hj
	}
	s.mu.Unlock()
	s.pokeLoop()
	t := time.NewTimer(time.Until(by))
	defer t.Stop()
	select {
	case <-hj.done:
		return hj.err
	case <-t.C:
		n.jobs.handUnstored.Add(1)
		return errors.New("the job loop did not store the job in time")
	case <-n.ctx.Done():
		return n.ctx.Err()
	}
}

// storeHanded stores, in one transaction, the jobs handed that the job
// loop's step did not store with a running ack.
func (n *Node) storeHanded() {
	s := &n.jobs
	s.mu.Lock()
	handed := s.handed
	s.handed = nil
	s.mu.Unlock()
	if len(handed) == 0 {
		return
	}
	var es []*gossip.Signed
	for _, hj := range handed {
		es = append(es, hj.e)
	}
	err := n.replica.Apply(es...)
	for _, hj := range handed {
		hj.stored(err)
	}
}

// pendingHanded are the jobs handed and not stored yet.
func (s *jobSet) pendingHanded() []*handedJob {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*handedJob, 0, len(s.handed))
	for _, hj := range s.handed {
		out = append(out, hj)
	}
	return out
}

// handedEntry is the job handed under key and not stored yet, if any.
func (s *jobSet) handedEntry(key string) (*gossip.Signed, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if hj := s.handed[key]; hj != nil {
		return hj.e, true
	}
	return nil, false
}

func (s *jobSet) isHanded(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handed[key] != nil
}

// claimHanded removes the job handed under key, if any, for its caller to
// store.
func (s *jobSet) claimHanded(key string) *handedJob {
	s.mu.Lock()
	defer s.mu.Unlock()
	hj := s.handed[key]
	delete(s.handed, key)
	return hj
}

// await registers a job stream waiting for this node's final ack of job
// id; answer hands it one.
func (s *jobSet) await(id string) chan *gossip.Signed {
	ch := make(chan *gossip.Signed, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiting == nil {
		s.waiting = map[string]chan *gossip.Signed{}
	}
	s.waiting[id] = ch
	return ch
}

func (s *jobSet) unawait(id string, ch chan *gossip.Signed) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiting[id] == ch {
		delete(s.waiting, id)
	}
}

// stopWaiting ends a job stream's wait for its job's ack, and returns the
// ack answer handed it meanwhile, if any: answer found the stream still
// waiting just as its wait ended, and its caller left the ack to the
// stream, which must still deliver it (on the stream, else by push).
// Dropped, such an ack reached the writer only by anti-entropy: in 50-job
// bursts to 25 agents, one job in a burst waited 16–45 s about every
// other run.
func (s *jobSet) stopWaiting(id string, ch chan *gossip.Signed) *gossip.Signed {
	s.unawait(id, ch)
	select {
	case ack := <-ch:
		return ack
	default:
		return nil
	}
}

// answer hands ack to the job stream waiting for job id, if one does.
func (s *jobSet) answer(id string, ack *gossip.Signed) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.waiting[id]
	if ok {
		delete(s.waiting, id)
		ch <- ack
	}
	return ok
}
