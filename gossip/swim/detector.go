package swim

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Transport carries the detector's messages between nodes. Its methods
// must be safe for concurrent use and return by ctx's end.
type Transport interface {
	// Ping sends m to node and returns its ack.
	Ping(ctx context.Context, node string, m Message) (Message, error)
	// PingReq asks via to probe target for this node (via's
	// HandlePingReq); an ack means target answered via. An error that
	// wraps ErrNack means via answered that target did not: via is
	// healthy, which tells this node its own health (Lifeguard); the
	// message then holds what via knows of target that is final (it
	// left, or is dead), if anything.
	PingReq(ctx context.Context, via, target string, m Message) (Message, error)
}

// ErrNack is a helper's answer to a ping-req that the target did not
// answer it either.
var ErrNack = errors.New("swim: the helper heard nothing from the target either")

// ErrBusy is a node's answer to a ping it had no room to take: it is
// alive, and it took nothing of the message. A probe answered so counts
// as answered: a node too loaded to serve is not a failed one, and
// taking it for one turns load into suspicions, refutations and more
// load: 200 agents joining one seed on 2 cores all suspected the seed,
// which refused 2,400 probes in 6 minutes.
var ErrBusy = errors.New("swim: the node is alive but too busy to take the message")

// Reacher is what a Transport may also do: make node reachable (a
// connection, for a transport of streams) before a probe, within ctx.
// The probe's timeout starts once it returns: on a loaded machine a dial
// and its handshake take longer than an answer, and counting them made
// each probe of a node this one was not connected to a likely
// suspicion. A dead node is still found: the dial fails, or its answer
// does not come.
type Reacher interface {
	Reach(ctx context.Context, node string) error
}

// Detector runs Members on a Transport: a probe loop and a gossip loop,
// and the handlers of the messages other nodes send. It is safe for
// concurrent use.
type Detector struct {
	cfg      Config
	tr       Transport
	onChange func([]Change)

	mu      sync.Mutex
	m       *Members
	batch   uint64    // batches of changes the core made (under mu)
	probes  uint64    // probes begun (under mu): every FarProbeEvery-th goes to the round
	farTold time.Time // when a suspect that is not a neighbour was last told (under mu)
	// Messages in flight from gossip (under mu): to whom, and how many of
	// them are gossip and how many words to suspects.
	out                map[string]bool
	gossiping, telling int

	// Changes reach onChange one batch at a time, in the order the core
	// made them (a suspect is never told after its dead): a batch waits
	// until the one before it was delivered.
	deliverMu sync.Mutex
	delivered uint64
	turn      *sync.Cond

	// wake ends the gossip loop's idle wait: something to spread or a
	// suspicion to time out came (see with).
	wake   chan struct{}
	rounds atomic.Int64 // gossip rounds run, for tests
	late   atomic.Int64 // failed probes this node saw end late (see probe)
	// probe outcomes: answered directly (or busy), answered through a
	// helper, failed (the target suspected here)
	acked, indirect, failed atomic.Int64
	// now is the clock the detector reads: time.Now, but for tests of
	// its own lag (watchLag).
	now func() time.Time
}

// New returns a detector for cfg.Self on tr. onChange, if not nil, is
// called with the members whose state changed here, from the detector's
// goroutines or the handlers' callers, one call at a time and in the
// order the changes were made, with no lock held. It may read the
// detector (State, Stats, Snapshot) but not change it, and must not
// block long: the next batch waits for it.
func New(cfg Config, tr Transport, rng *rand.Rand, onChange func([]Change)) (*Detector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if onChange == nil {
		onChange = func([]Change) {}
	}
	cfg = cfg.withDefaults()
	d := &Detector{cfg: cfg, tr: tr, onChange: onChange, m: NewMembers(cfg, rng), wake: make(chan struct{}, 1), now: time.Now}
	d.turn = sync.NewCond(&d.deliverMu)
	return d, nil
}

// Run probes and gossips until ctx ends.
func (d *Detector) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { d.every(ctx, d.cfg.ProbeInterval, d.probe) })
	wg.Go(func() { d.gossipLoop(ctx) })
	wg.Wait()
}

// gossipLoop runs gossip every GossipInterval while there is something to
// spread or a suspicion to time out, and otherwise sleeps until there is
// (wake), then gossips at once. memberlist ticks every 200 ms regardless;
// here a tick of an idle agent cost more than the tick's work, waking a
// process whose CPU had gone idle. 20 agents on loopback, 150 s after
// they started, idled at 119 and 169 ms of CPU a minute each against 199
// and 202 ticking (by hand, the builds alternated); one agent alone at
// 100 against 120–180.
func (d *Detector) gossipLoop(ctx context.Context) {
	t := time.NewTimer(d.cfg.GossipInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.gossip(ctx)
		select { // a wake from before this round: it saw that already
		case <-d.wake:
		default:
		}
		if !d.busy() {
			select {
			case <-ctx.Done():
				return
			case <-d.wake:
			}
			d.gossip(ctx)
		}
		t.Reset(d.cfg.GossipInterval)
	}
}

// busy reports whether there are changes to spread and members to spread
// them to, or suspects: what the gossip loop ticks for. A node alone
// holds its own alive news until a member comes (Add wakes the loop).
func (d *Detector) busy() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return (d.m.Pending() && d.m.Len() > 1) || d.m.Suspects() > 0
}

func (d *Detector) every(ctx context.Context, interval time.Duration, f func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f(ctx)
		}
	}
}

// with runs f on the core under the lock and reports its changes after,
// in the order the core made them.
func (d *Detector) with(f func(m *Members) []Change) {
	d.mu.Lock()
	changes := f(d.m)
	if d.m.Pending() || d.m.Suspects() > 0 {
		select { // the gossip loop may be asleep: it has work now
		case d.wake <- struct{}{}:
		default:
		}
	}
	if len(changes) == 0 {
		d.mu.Unlock()
		return
	}
	d.batch++
	mine := d.batch
	d.mu.Unlock()

	d.deliverMu.Lock()
	for d.delivered != mine-1 {
		d.turn.Wait()
	}
	d.deliverMu.Unlock()
	d.onChange(changes)
	d.deliverMu.Lock()
	d.delivered = mine
	d.turn.Broadcast()
	d.deliverMu.Unlock()
}

// message is what to send to node next: the changes to piggyback, and
// this node's suspicion of node if it holds one.
func (d *Detector) message(node string) Message {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Message{Updates: d.m.PiggybackTo(node)}
}

// receive applies what a message carried.
func (d *Detector) receive(m Message) {
	if len(m.Updates) == 0 {
		return
	}
	now := d.now()
	d.with(func(mb *Members) []Change { return mb.Apply(m.Updates, now) })
}

// probe probes the next member: directly, then through IndirectChecks
// others until the probe interval ends; if nobody hears from it, it is
// suspect. The timeout and the interval stretch with the local health
// score, and the outcome moves it (Lifeguard's awareness): a node that
// cannot get answers itself waits longer before it accuses anyone.
//
// A failed probe whose verdict this node saw come late, by more than a
// LateShare of the probe timeout, accuses no one: the node itself was
// not running (its CPU starved, its process stopped, its VM paused), so
// the answers may have come and waited unread. It counts against the
// node's own health instead. The verdict is the helpers' window's, or
// the direct ping's when there are no helpers to ask (the helpers probe
// the target afresh, whatever happened to the ping). Lifeguard's nacks
// tell a slow prober from a slow target only when the helpers answer it
// in time, and a prober paused during their window misses their acks
// too.
func (d *Detector) probe(ctx context.Context) {
	var near []string
	if d.cfg.Neighbours != nil {
		near = d.cfg.Neighbours() // outside the lock: it asks the transport
	}
	d.mu.Lock()
	d.probes++
	var target string
	var ok bool
	if d.cfg.Neighbours != nil && d.probes%uint64(d.cfg.FarProbeEvery) != 0 {
		target, ok = d.m.NextProbeNear(near)
	} else {
		target, ok = d.m.NextProbe()
	}
	timeout, interval := d.m.Scale(d.cfg.ProbeTimeout), d.m.Scale(d.cfg.ProbeInterval)
	d.mu.Unlock()
	if !ok {
		return
	}
	// late is how long after the direct ping's deadline this node saw it
	// pass.
	var late time.Duration
	err := d.reach(ctx, target, interval)
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		lag := watchLag(pctx, d.now)
		var ack Message
		sent := d.now()
		ack, err = d.tr.Ping(pctx, target, d.message(target))
		rtt := d.now().Sub(sent)
		late = lag() // before cancel: an ended ping costs no watcher
		cancel()
		if err == nil || errors.Is(err, ErrBusy) {
			d.acked.Add(1)
			d.health(ackHealthDelta(rtt, d.cfg.ProbeTimeout, timeout))
			d.receive(ack)
			return
		}
	}
	d.mu.Lock()
	vias := d.helpers(near, target)
	d.mu.Unlock()
	ictx, cancel := context.WithTimeout(ctx, interval-timeout)
	defer cancel()
	lag := watchLag(ictx, d.now)
	answered := make(chan error, len(vias))
	for _, via := range vias {
		msg := d.message(via)
		go func() {
			ack, err := d.tr.PingReq(ictx, via, target, msg)
			if err == nil || errors.Is(err, ErrNack) {
				d.receive(ack) // a nack may say target left or died
			}
			answered <- err
		}()
	}
	nacks := 0
	for range vias {
		err := <-answered
		if err == nil {
			d.indirect.Add(1)
			d.health(probeHealthDelta(true, len(vias), nacks))
			return
		}
		if errors.Is(err, ErrNack) {
			nacks++
		}
	}
	if ctx.Err() != nil {
		return
	}
	if len(vias) > 0 {
		late = lag()
	}
	if late > timeout/LateShare {
		d.late.Add(1)
		d.health(1)
		return
	}
	d.failed.Add(1)
	d.health(probeHealthDelta(false, len(vias), nacks))
	now := d.now()
	d.with(func(m *Members) []Change { return m.ProbeFailed(target, now) })
}

// LateShare: a failed probe whose deadline this node saw pass more than
// ProbeTimeout/LateShare late accuses no one (see probe). A fifth (100
// ms of the default 500) is far past the lag of a timer in a process
// that runs, and well inside that of one waiting for a starved CPU.
const LateShare = 5

// watchLag watches ctx for its deadline. The func it returns, called
// before ctx is cancelled, is how late after the deadline
// (by now) this process ran the timer's callback: its own scheduling
// lag, not how long the transport took to give up (a transport slow to
// honour a deadline must not hide a dead member). Zero if ctx ended
// otherwise, or had not ended (then the watch is dropped, and nothing
// runs when ctx is cancelled).
func watchLag(ctx context.Context, now func() time.Time) func() time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return func() time.Duration { return 0 }
	}
	var lag time.Duration
	seen := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		if ctx.Err() == context.DeadlineExceeded {
			lag = max(0, now().Sub(dl))
		}
		close(seen)
	})
	return func() time.Duration {
		if stop() {
			return 0 // ctx had not ended: nothing ran late
		}
		<-seen
		return lag
	}
}

// reach gives the transport up to within to make target reachable, if
// it is a Reacher.
func (d *Detector) reach(ctx context.Context, target string, within time.Duration) error {
	r, ok := d.tr.(Reacher)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	return r.Reach(ctx, target)
}

// health moves the local health score by delta.
func (d *Detector) health(delta int) {
	d.mu.Lock()
	d.m.HealthDelta(delta)
	d.mu.Unlock()
}

// gossip ends the suspicions whose time ran out and, while there are
// changes to spread, sends them to GossipNodes random members (of the
// neighbours, if Config.Neighbours names some); and it tells one member
// this node suspects, at random, of the suspicion, so that it refutes it
// if it can (its gossip may have been lost while the fleet was too busy,
// as in a start-up storm). With Neighbours set, a suspect that is not a
// neighbour is told at most once a probe interval: the word may cost a
// connection, and a busy fleet suspects the most.
//
// At most GossipNodes messages of gossip are in flight at once, and
// maxTelling words to suspects, never two to one member: a message
// answered or timed out frees its place. A fleet too busy to answer
// hears less often from each node, where sending every interval
// regardless piled streams on it (memberlist's gossip is a UDP datagram;
// here each message is a stream and an ack), and a member slow to answer
// holds up no message to another. Measured with 100 agents started at
// once on 2 cores, joining one seed: with the pile, both cores stayed busy
// past 3 minutes and no agent listed all 100 alive; bounded, four runs
// converged in 62 to 121 s (by hand; the issue 14 note has the rest).
func (d *Detector) gossip(ctx context.Context) {
	d.rounds.Add(1)
	now := d.now()
	d.with(func(m *Members) []Change { return m.Tick(now) })
	d.mu.Lock()
	pending := d.m.Pending() && d.gossiping < d.cfg.GossipNodes
	suspects := d.m.Suspects() > 0 && d.telling < maxTelling
	d.mu.Unlock()
	if !pending && !suspects {
		return
	}
	var near []string
	if d.cfg.Neighbours != nil {
		near = d.cfg.Neighbours() // outside the lock: it asks the transport
	}
	d.mu.Lock()
	if d.out == nil {
		d.out = map[string]bool{}
	}
	var to []string
	if pending {
		to = d.gossipTargets(near)
		to = to[:min(len(to), d.cfg.GossipNodes-d.gossiping)]
	}
	suspect := ""
	if suspects {
		// A suspect this node holds no connection to is told at most
		// once a probe interval in all: each costs a dial.
		far := func(s string) bool { return d.cfg.Neighbours != nil && !slices.Contains(near, s) }
		if s, ok := d.m.SuspectToTell(now, func(s string) bool {
			return !d.out[s] && !contains(to, s) && (!far(s) || now.Sub(d.farTold) >= d.cfg.ProbeInterval)
		}); ok {
			suspect = s
			d.telling++
			d.out[s] = true
			if far(s) {
				d.farTold = now
			}
		}
	}
	d.gossiping += len(to)
	for _, node := range to {
		d.out[node] = true
	}
	d.mu.Unlock()
	done := func(node string, count *int) {
		d.mu.Lock()
		delete(d.out, node)
		*count--
		d.mu.Unlock()
	}
	if suspect != "" {
		go func() {
			d.send(ctx, suspect)
			done(suspect, &d.telling)
		}()
	}
	for _, node := range to {
		go func() {
			d.send(ctx, node)
			done(node, &d.gossiping)
		}()
	}
}

// inFlight is how many messages of gossip (and words to suspects) are in
// flight.
func (d *Detector) inFlight() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.out)
}

// maxTelling bounds the words to suspects in flight at once: a suspect
// that crashed holds its place until the probe timeout.
const maxTelling = 2

// send gives node what there is to tell it, if anything, and takes in
// its answer.
func (d *Detector) send(ctx context.Context, node string) {
	msg := d.message(node)
	if len(msg.Updates) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.ProbeTimeout)
	defer cancel()
	if ack, err := d.tr.Ping(ctx, node, msg); err == nil {
		d.receive(ack)
	}
}

// helpers is whom to ask to probe target: IndirectChecks alive members,
// of the neighbours if Config.Neighbours is set and enough of them are
// members. Called under mu.
func (d *Detector) helpers(near []string, target string) []string {
	if d.cfg.Neighbours != nil {
		near = slices.DeleteFunc(slices.Clone(near), func(n string) bool {
			st, _, _ := d.m.State(n)
			return n == target || st != Alive
		})
		if vias := d.m.RandomOf(d.cfg.IndirectChecks, near); len(vias) == d.cfg.IndirectChecks {
			return vias
		}
	}
	return d.m.Random(d.cfg.IndirectChecks, false, target)
}

// gossipTargets is whom changes go to this round: GossipNodes of the
// neighbours, or of all members if there are no neighbours to ask or none
// is a member; never one a message is in flight to. Called under mu.
func (d *Detector) gossipTargets(near []string) []string {
	if d.cfg.Neighbours != nil {
		near = slices.DeleteFunc(slices.Clone(near), func(n string) bool { return d.out[n] })
		if to := d.m.RandomOf(d.cfg.GossipNodes, near); len(to) > 0 {
			return to
		}
	}
	busy := make([]string, 0, len(d.out))
	for n := range d.out {
		busy = append(busy, n)
	}
	return d.m.Random(d.cfg.GossipNodes, true, busy...)
}

// Receive takes what a message from a node that is not a member carried,
// and answers nothing: what a node has to tell is for its members (each
// update goes out a bounded number of times, which a stranger's pings
// must not spend). Each update is still verified.
func (d *Detector) Receive(m Message) { d.receive(m) }

// HandlePing answers a probe (or gossip) from node from.
func (d *Detector) HandlePing(from string, m Message) Message {
	d.receive(m)
	return d.message(from)
}

// HandlePingReq probes target for node from and answers when target
// did; the error is why it did not (ctx bounds the wait), and the message
// then holds this node's word that target left or is dead, if it holds
// one: a requester that missed a leave (or a death) learns it here rather
// than accusing a node that is gone for good, as its snapshot trades
// would tell it a minute later. It gives up in time for its nack to reach
// a healthy requester before the requester's indirect window
// (ProbeInterval − ProbeTimeout) closes: a nack that comes late reads as
// the requester's own ill health.
func (d *Detector) HandlePingReq(ctx context.Context, from, target string, m Message) (Message, error) {
	d.receive(m)
	ctx, cancel := context.WithTimeout(ctx, min(d.cfg.ProbeTimeout, (d.cfg.ProbeInterval-d.cfg.ProbeTimeout)*4/5))
	defer cancel()
	ack, err := d.tr.Ping(ctx, target, d.message(target))
	if err != nil && !errors.Is(err, ErrBusy) { // busy is alive
		d.mu.Lock()
		defer d.mu.Unlock()
		var gone Message
		if u, ok := d.m.Gone(target); ok {
			gone.Updates = []Update{u}
		}
		return gone, err
	}
	d.receive(ack)
	return d.message(from), nil
}

// Add makes node a member, alive, if it is not known yet.
func (d *Detector) Add(node string) {
	now := d.now()
	d.with(func(m *Members) []Change { m.Add(node, now); return nil })
}

// Remove forgets node.
func (d *Detector) Remove(node string) {
	d.with(func(m *Members) []Change { m.Remove(node); return nil })
}

// Announce says this node is alive in incarnation inc (or its current
// one, if higher): at start, with an incarnation above any of an earlier
// run's (the node uses its start time).
func (d *Detector) Announce(inc uint64) {
	d.with(func(m *Members) []Change { m.Announce(inc); return nil })
}

// State is what this node believes of node; ok is false for a stranger.
func (d *Detector) State(node string) (State, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, _, ok := d.m.State(node)
	return s, ok
}

// Stats are the detector's counters.
type Stats struct {
	Members int   // known, this node included
	Bad     int64 // updates whose signature did not verify
	Health  int   // the local health score (Members.Health)
	// Late counts the failed probes this node saw end late and so held
	// against itself, not their target (see probe).
	Late int64
	// Acked, Indirect and Failed count the other probes by outcome:
	// answered by the target (or its busy answer), answered through a
	// helper, or failed (the target is suspect here).
	Acked, Indirect, Failed int64
	// Counts is the claims taken and refuted.
	Counts Counts
}

func (d *Detector) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Stats{Members: d.m.Len(), Bad: d.m.Bad(), Health: d.m.Health(), Late: d.late.Load(),
		Acked: d.acked.Load(), Indirect: d.indirect.Load(), Failed: d.failed.Load(), Counts: d.m.Counts()}
}

// Leave says this node is leaving to up to GossipNodes × RetransmitMult
// members at once, and waits for their acks or ctx: the members hear it
// left instead of suspecting it. Call it before stopping Run. With
// Config.Neighbours set they are neighbours first, and other members only
// to make up GossipNodes: each that hears it gossips it on, and a message
// to a member that is not a neighbour may cost a connection. Told at
// random, a 20-node fleet stopping at once opened two dials in three of
// all its dials since start.
func (d *Detector) Leave(ctx context.Context) {
	var near []string
	if d.cfg.Neighbours != nil {
		near = d.cfg.Neighbours()
	}
	d.mu.Lock()
	msg := Message{Updates: []Update{d.m.Leave()}}
	to := d.leaveTargets(near)
	d.mu.Unlock()
	var wg sync.WaitGroup
	for _, node := range to {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, d.cfg.ProbeTimeout)
			defer cancel()
			d.tr.Ping(ctx, node, msg)
		})
	}
	wg.Wait()
}

// leaveTargets is whom Leave tells: up to GossipNodes × RetransmitMult of
// the neighbours near, made up to GossipNodes with other members; all
// members at random if Config.Neighbours is not set. Called under mu.
func (d *Detector) leaveTargets(near []string) []string {
	k := d.cfg.GossipNodes * d.cfg.RetransmitMult
	if d.cfg.Neighbours == nil {
		return d.m.Random(k, true)
	}
	to := d.m.RandomOf(k, near)
	if len(to) < d.cfg.GossipNodes {
		to = append(to, d.m.Random(d.cfg.GossipNodes-len(to), true, to...)...)
	}
	return to
}

// Snapshot is the members that are not alive (Members.Snapshot), for a
// push-pull exchange.
func (d *Detector) Snapshot() []Update {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.m.Snapshot()
}

// Corrections is Members.Corrections: what this node knows newer of the
// members another node's snapshot holds not alive.
func (d *Detector) Corrections(us []Update) []Update {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.m.Corrections(us)
}

// ApplySnapshot takes another node's snapshot.
func (d *Detector) ApplySnapshot(us []Update) {
	now := d.now()
	d.with(func(m *Members) []Change { return m.ApplySnapshot(us, now) })
}
