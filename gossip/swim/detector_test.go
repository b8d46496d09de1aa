package swim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// noTransport answers nothing: the test below drives the detector only
// through its handlers.
type noTransport struct{}

func (noTransport) Ping(context.Context, string, Message) (Message, error) {
	return Message{}, errors.New("no network")
}

func (noTransport) PingReq(context.Context, string, string, Message) (Message, error) {
	return Message{}, errors.New("no network")
}

// TestChangesDeliveredInOrder: claims about one member arrive on many
// goroutines at once, as probes and gossip do. onChange is never called
// twice at once, and it hears the member's states in the order the core
// took them: never suspect after dead of the same incarnation (the core
// refuses that order), which a watcher would show as a node coming back
// from the dead.
func TestChangesDeliveredInOrder(t *testing.T) {
	for round := range 200 {
		var (
			in      atomic.Int32
			overlap atomic.Bool
			mu      sync.Mutex
			seen    []State
		)
		d, err := New(Config{Self: "a"}, noTransport{}, rand.New(rand.NewPCG(uint64(round), 1)), func(cs []Change) {
			if in.Add(1) > 1 {
				overlap.Store(true)
			}
			defer in.Add(-1)
			for range 50 { // widen the window another batch would race into
				runtime.Gosched()
			}
			for _, c := range cs {
				mu.Lock()
				seen = append(seen, c.State)
				mu.Unlock()
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		d.Add("b")
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, s := range []State{Suspect, Dead, Suspect, Dead} {
			from := string(rune('c' + i))
			wg.Go(func() {
				<-start
				d.HandlePing(from, Message{Updates: []Update{{Node: "b", State: s, Incarnation: 0, From: from}}})
			})
		}
		close(start)
		wg.Wait()
		if overlap.Load() {
			t.Fatalf("round %d: onChange called twice at once", round)
		}
		for i := 1; i < len(seen); i++ {
			if seen[i-1] == Dead && seen[i] == Suspect {
				t.Fatalf("round %d: delivered %v: suspect after dead", round, seen)
			}
		}
	}
}

// pingLog answers every ping and notes whom it went to.
type pingLog struct {
	mu sync.Mutex
	to []string
}

func (p *pingLog) Ping(_ context.Context, node string, _ Message) (Message, error) {
	p.mu.Lock()
	p.to = append(p.to, node)
	p.mu.Unlock()
	return Message{}, nil
}

func (p *pingLog) PingReq(context.Context, string, string, Message) (Message, error) {
	return Message{}, errors.New("not used")
}

func (p *pingLog) sent() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.to)
}

// TestGossipGoesToNeighbours: with Config.Neighbours, changes go only to
// the neighbours that are members (not to the other 17 members, which a
// transport would have to dial), and to any member when no neighbour is
// one; without it, to members at random.
func TestGossipGoesToNeighbours(t *testing.T) {
	members := []string{}
	for i := range 20 {
		members = append(members, fmt.Sprintf("m%02d", i))
	}
	run := func(neighbours []string, set bool) map[string]int {
		t.Helper()
		var tr pingLog
		cfg := Config{Self: "self"}
		if set {
			cfg.Neighbours = func() []string { return neighbours }
		}
		d, err := New(cfg, &tr, rand.New(rand.NewPCG(3, 4)), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range members {
			d.Add(m)
		}
		got := map[string]int{}
		for range 50 {
			d.Announce(1) // a change to spread
			d.gossip(context.Background())
			// The sends run on their own goroutines: wait for this round's.
			for deadline := time.Now().Add(5 * time.Second); d.inFlight() > 0 && time.Now().Before(deadline); {
				runtime.Gosched()
			}
			for _, n := range tr.sent() {
				got[n]++
			}
			tr.mu.Lock()
			tr.to = nil
			tr.mu.Unlock()
		}
		return got
	}
	near := []string{"m03", "m07", "m11", "stranger"}
	got := run(near, true)
	if len(got) != 3 || got["m03"] == 0 || got["m07"] == 0 || got["m11"] == 0 {
		t.Fatalf("with neighbours m03, m07, m11 (and a stranger): gossip went to %v", got)
	}
	if got := run([]string{"stranger"}, true); len(got) < 10 {
		t.Fatalf("with no neighbour a member: gossip went to %v, want members at random", got)
	}
	if got := run(nil, false); len(got) < 10 {
		t.Fatalf("without Neighbours: gossip went to %v, want members at random", got)
	}
}

// TestLeaveTellsNeighbours: with Config.Neighbours, Leave tells the
// neighbours that are members (up to GossipNodes × RetransmitMult), and
// other members only to make up GossipNodes; without it, members at
// random.
func TestLeaveTellsNeighbours(t *testing.T) {
	members := []string{}
	for i := range 40 {
		members = append(members, fmt.Sprintf("m%02d", i))
	}
	many := members[:20]
	for _, tc := range []struct {
		name     string
		near     []string
		set      bool
		want     int // told
		wantNear int // of them neighbours
	}{
		{"three neighbours", []string{"m03", "m07", "m11", "stranger"}, true, 3, 3},
		{"one neighbour", []string{"m05"}, true, 3, 1},
		{"none a member", []string{"stranger"}, true, 3, 0},
		{"more than it tells", many, true, 12, 12},
		{"no Neighbours", nil, false, 12, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Self: "self", GossipNodes: 3, RetransmitMult: 4}
			if tc.set {
				cfg.Neighbours = func() []string { return tc.near }
			}
			var tr pingLog
			d, err := New(cfg, &tr, rand.New(rand.NewPCG(7, 8)), nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range members {
				d.Add(m)
			}
			d.Leave(context.Background())
			told := tr.sent()
			slices.Sort(told)
			if len(told) != tc.want || len(slices.Compact(slices.Clone(told))) != len(told) {
				t.Fatalf("told %v, want %d members once each", told, tc.want)
			}
			near := 0
			for _, m := range told {
				if !slices.Contains(members, m) {
					t.Fatalf("told %s, not a member", m)
				}
				if slices.Contains(tc.near, m) {
					near++
				}
			}
			if tc.set && near != tc.wantNear {
				t.Fatalf("told %v: %d neighbours, want %d", told, near, tc.wantNear)
			}
		})
	}
}

// TestProbesStayWithNeighbours: with Config.Neighbours, one probe in
// FarProbeEvery goes to the round over all members, the others to
// neighbours; a failed probe asks neighbours to help.
func TestProbesStayWithNeighbours(t *testing.T) {
	var tr pingLog
	near := []string{"m01", "m02", "m03", "m04", "m05"}
	cfg := Config{Self: "self", FarProbeEvery: 4, Neighbours: func() []string { return near }}
	d, err := New(cfg, &tr, rand.New(rand.NewPCG(5, 6)), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		d.Add(fmt.Sprintf("m%02d", i+1))
	}
	for range 40 {
		d.probe(context.Background())
	}
	far := 0
	for _, to := range tr.sent() {
		if !slices.Contains(near, to) {
			far++
		}
	}
	// Every 4th probe is the round's: 10, of which about 1 in 8 lands on
	// a neighbour anyway.
	if far < 6 || far > 10 {
		t.Fatalf("%d of 40 probes left the neighbours, want every 4th at most (%v)", far, tr.sent())
	}

	d.mu.Lock()
	vias := d.helpers(near, "m03")
	d.mu.Unlock()
	if len(vias) != 3 || slices.Contains(vias, "m03") {
		t.Fatalf("helpers for m03 = %v, want 3 other neighbours", vias)
	}
	for _, v := range vias {
		if !slices.Contains(near, v) {
			t.Fatalf("helper %s is not a neighbour (%v)", v, vias)
		}
	}
}

// hungFleet answers nothing until the caller gives up (or, if hung is
// set, only the members it names; the others at once), and notes the
// most messages it held at once, in all and to any one member, and the
// messages each member was sent.
type hungFleet struct {
	hung func(node string) bool

	mu             sync.Mutex
	in, sent       map[string]int
	all, peak, one int
}

func (h *hungFleet) Ping(ctx context.Context, node string, _ Message) (Message, error) {
	h.mu.Lock()
	if h.in == nil {
		h.in, h.sent = map[string]int{}, map[string]int{}
	}
	h.in[node]++
	h.sent[node]++
	h.all++
	h.peak, h.one = max(h.peak, h.all), max(h.one, h.in[node])
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.in[node]--
		h.all--
		h.mu.Unlock()
	}()
	if h.hung != nil && !h.hung(node) {
		return Message{}, nil
	}
	<-ctx.Done()
	return Message{}, ctx.Err()
}

func (h *hungFleet) PingReq(ctx context.Context, _, _ string, _ Message) (Message, error) {
	<-ctx.Done()
	return Message{}, ctx.Err()
}

// TestGossipInFlightIsBounded: at most GossipNodes messages of gossip and
// 2 words to suspects are in flight at once, never two to one
// member. A fleet too busy to answer within the probe timeout (2.5
// gossip intervals here) hears less often from each node, instead of
// each node piling more streams on it every interval, which kept 100
// agents starting at once on 2 cores saturated for minutes.
func TestGossipInFlightIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var tr hungFleet
		cfg := Config{Self: "self", ProbeInterval: time.Hour, ProbeTimeout: 500 * time.Millisecond}
		d, err := New(cfg, &tr, rand.New(rand.NewPCG(7, 8)), nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 100 {
			d.Add(fmt.Sprintf("m%02d", i))
		}
		d.Announce(1) // a change to spread: 12 sends at 100 members
		// and suspects to tell, each gossip interval
		for i := range 5 {
			d.HandlePing("m99", Message{Updates: []Update{{Node: fmt.Sprintf("m%02d", i), State: Suspect, From: "m99"}}})
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		d.Run(ctx)
		synctest.Wait()
		if most := d.cfg.GossipNodes + maxTelling; tr.peak > most {
			t.Fatalf("%d messages in flight at once, want at most %d (%d of gossip, %d words to suspects)", tr.peak, most, d.cfg.GossipNodes, maxTelling)
		}
		if tr.one != 1 {
			t.Fatalf("%d messages in flight at once to one member, want 1", tr.one)
		}
	})
}

// TestSlowMemberHoldsNoGossipUp: a suspect that hangs until the probe
// timeout holds up no message to the others, and is told of its
// suspicion again each time its last word ends.
func TestSlowMemberHoldsNoGossipUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := hungFleet{hung: func(node string) bool { return node == "m0" }}
		cfg := Config{Self: "self", ProbeInterval: time.Hour, ProbeTimeout: 500 * time.Millisecond}
		d, err := New(cfg, &tr, rand.New(rand.NewPCG(9, 10)), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []string{"m0", "m1", "m2"} {
			d.Add(m)
		}
		d.HandlePing("m1", Message{Updates: []Update{{Node: "m0", State: Suspect, From: "m1"}}})
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		var announcing sync.WaitGroup
		announcing.Go(func() { // changes to spread all along
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for inc := uint64(2); ; inc++ {
				d.Announce(inc)
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
		d.Run(ctx)
		announcing.Wait()
		synctest.Wait()
		// 50 gossip intervals of 200 ms: about 2 messages each to m1 and
		// m2 (m0 has one in flight most of the time); had each waited for
		// m0's answer, one interval in 2.5.
		if others := tr.sent["m1"] + tr.sent["m2"]; others < 80 {
			t.Fatalf("m1 and m2 were sent %d messages in 10 s, want about 100: the hung m0 held gossip up", others)
		}
		if tr.sent["m0"] < 10 {
			t.Fatalf("the hung suspect m0 was sent %d messages in 10 s, want one each probe timeout (about 20)", tr.sent["m0"])
		}
	})
}

// TestIdleGossipLoopSleeps: with nothing to spread and nobody suspected,
// the gossip loop runs no round (memberlist's ticks every GossipInterval
// cost an idle agent more than their work); a change made while it
// sleeps goes out at once, and it ticks again until the change has been
// sent its RetransmitMult times.
func TestIdleGossipLoopSleeps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var tr pingLog
		cfg := Config{Self: "self", ProbeInterval: time.Hour}
		d, err := New(cfg, &tr, rand.New(rand.NewPCG(11, 12)), nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			d.Add(fmt.Sprintf("m%02d", i))
		}
		ctx, cancel := context.WithCancel(t.Context())
		var running sync.WaitGroup
		running.Go(func() { d.Run(ctx) })
		defer func() { cancel(); running.Wait() }()
		time.Sleep(time.Minute)
		synctest.Wait()
		if r := d.rounds.Load(); r > 1 {
			t.Fatalf("%d gossip rounds in an idle minute, want at most the first", r)
		}
		before := d.rounds.Load()
		d.Announce(1)
		synctest.Wait()
		if d.rounds.Load() == before || len(tr.sent()) == 0 {
			t.Fatalf("a change made while the loop slept: %d rounds, sent to %v", d.rounds.Load()-before, tr.sent())
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if d.busy() {
			t.Fatal("the change is still pending a minute later")
		}
		ran := d.rounds.Load() - before
		time.Sleep(time.Minute)
		synctest.Wait()
		if idle := d.rounds.Load() - before - ran; idle != 0 || ran > 100 {
			t.Fatalf("%d rounds to spread one change, then %d in an idle minute", ran, idle)
		}
	})
}

// slowDialFleet is a transport of streams on a loaded machine: reaching
// a member takes dial (in Reach if reach is set, else inside Ping's
// timeout), and then each answers at once, busy if busy says so.
type slowDialFleet struct {
	dial  time.Duration
	reach bool
	busy  func(node string) bool

	mu     sync.Mutex
	dialed map[string]bool
}

func (f *slowDialFleet) connect(ctx context.Context, node string) error {
	f.mu.Lock()
	done := f.dialed[node]
	f.mu.Unlock()
	if done {
		return nil
	}
	select {
	case <-time.After(f.dial):
	case <-ctx.Done():
		return ctx.Err()
	}
	f.mu.Lock()
	if f.dialed == nil {
		f.dialed = map[string]bool{}
	}
	f.dialed[node] = true
	f.mu.Unlock()
	return nil
}

func (f *slowDialFleet) Ping(ctx context.Context, node string, _ Message) (Message, error) {
	if err := f.connect(ctx, node); err != nil {
		return Message{}, err
	}
	// A transport that released the probe's connection dials again.
	f.mu.Lock()
	delete(f.dialed, node)
	f.mu.Unlock()
	if f.busy != nil && f.busy(node) {
		return Message{}, fmt.Errorf("m: %w", ErrBusy)
	}
	return Message{}, nil
}

func (f *slowDialFleet) PingReq(ctx context.Context, _, target string, m Message) (Message, error) {
	return f.Ping(ctx, target, m) // the helper dials as slowly
}

// reachingFleet is a slowDialFleet that is also a Reacher.
type reachingFleet struct{ *slowDialFleet }

func (f reachingFleet) Reach(ctx context.Context, node string) error { return f.connect(ctx, node) }

// suspectedAfter probes 20 members once each on tr and returns how many
// are suspect.
func suspectedAfter(t *testing.T, tr Transport) int {
	t.Helper()
	cfg := Config{Self: "self", ProbeInterval: time.Second, ProbeTimeout: 500 * time.Millisecond}
	d, err := New(cfg, tr, rand.New(rand.NewPCG(9, 10)), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		d.Add(fmt.Sprintf("m%02d", i))
	}
	for range 20 {
		d.probe(t.Context())
	}
	n := 0
	for i := range 20 {
		if st, _ := d.State(fmt.Sprintf("m%02d", i)); st != Alive {
			n++
		}
	}
	return n
}

// TestProbeTimeoutStartsAfterTheDial: on a machine so loaded that a dial
// and its handshake take 700 ms, longer than the 500 ms probe timeout,
// members that answer at once are not suspected when the transport
// reaches them before the timed ping (Reacher); timed together, a
// probe of a member not connected is often a suspicion.
func TestProbeTimeoutStartsAfterTheDial(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		if n := suspectedAfter(t, reachingFleet{&slowDialFleet{dial: 700 * time.Millisecond}}); n != 0 {
			t.Fatalf("%d of 20 members suspect after a round of probes with the dial apart, want 0", n)
		}
		// Timed together, a probe fails until the timeout has stretched
		// past the dial: Lifeguard's awareness stretches it after a
		// suspicion, and answers that took over half of it hold it
		// there (ackHealthDelta; when each answer relaxed it, one probe
		// in four suspected a live member here).
		if n := suspectedAfter(t, &slowDialFleet{dial: 700 * time.Millisecond}); n < 1 {
			t.Fatalf("%d of 20 members suspect with the dial inside the probe timeout, want at least 1 (the case Reacher is for)", n)
		}
	})
}

// TestBusyIsAlive: a member that answers busy (no room to take the
// message) is not suspected, whether it answers the probe itself or a
// helper's ping; and the prober's health is not worse for it.
func TestBusyIsAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		busy := func(string) bool { return true }
		if n := suspectedAfter(t, &slowDialFleet{busy: busy}); n != 0 {
			t.Fatalf("%d of 20 busy members suspect, want 0", n)
		}
		cfg := Config{Self: "self", ProbeInterval: time.Second, ProbeTimeout: 500 * time.Millisecond}
		d, err := New(cfg, &slowDialFleet{busy: busy}, rand.New(rand.NewPCG(11, 12)), nil)
		if err != nil {
			t.Fatal(err)
		}
		d.Add("m00")
		d.Add("asker")
		if _, err := d.HandlePingReq(t.Context(), "asker", "m00", Message{}); err != nil {
			t.Fatalf("a ping-req of a busy member: %v, want an ack", err)
		}
		if h := d.Stats().Health; h != 0 {
			t.Fatalf("health %d after busy answers, want 0", h)
		}
	})
}

// silent answers no probe: every ping and ping-req waits out its
// deadline, as to a member that died.
type silent struct{}

func (silent) Ping(ctx context.Context, _ string, _ Message) (Message, error) {
	<-ctx.Done()
	return Message{}, ctx.Err()
}

func (silent) PingReq(ctx context.Context, _, _ string, _ Message) (Message, error) {
	<-ctx.Done()
	return Message{}, ctx.Err()
}

// pausedPinger answers no probe, and stands for a prober paused while
// its direct ping was in flight: the clock reads lag past the bubble's
// time until the helpers are asked (lag stays if helpersToo is set).
type pausedPinger struct {
	silent
	lag        *atomic.Int64
	helpersToo bool
}

func (p pausedPinger) PingReq(ctx context.Context, via, target string, m Message) (Message, error) {
	if !p.helpersToo {
		p.lag.Store(0)
	}
	return p.silent.PingReq(ctx, via, target, m)
}

// TestLateProbeAccusesNoOne: a probe that nobody answers makes its
// target suspect, unless this node saw the verdict's deadline pass more
// than ProbeTimeout/LateShare late (its clock read that much past the
// deadline when the timer's callback ran: the process was not running).
// Then the target stays alive, the probe is counted late, and the node's
// own health score takes the blame. Just under the share, it accuses;
// and a prober late only for its direct ping accuses too, as the
// helpers, asked on time, probed the target afresh.
func TestLateProbeAccusesNoOne(t *testing.T) {
	timeout := DefaultConfig().ProbeTimeout
	share := timeout / LateShare
	for _, tc := range []struct {
		name       string
		lag        time.Duration
		helpersToo bool
		suspect    bool
	}{
		{"on time", 0, true, true},
		{"just under the share", share - time.Millisecond, true, true},
		{"late", share + time.Millisecond, true, false},
		{"late for the ping only", share + time.Millisecond, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var lag atomic.Int64
				lag.Store(int64(tc.lag))
				d, err := New(Config{Self: "self"}, pausedPinger{lag: &lag, helpersToo: tc.helpersToo}, rand.New(rand.NewPCG(1, 2)), nil)
				if err != nil {
					t.Fatal(err)
				}
				// The bubble's timers fire on time: a clock that reads
				// lag past them is a process that ran them that late.
				d.now = func() time.Time { return time.Now().Add(time.Duration(lag.Load())) }
				for _, m := range []string{"b", "c", "d", "e"} {
					d.Add(m)
				}
				d.probe(t.Context())
				suspects := 0
				for _, m := range []string{"b", "c", "d", "e"} {
					if st, _ := d.State(m); st == Suspect {
						suspects++
					}
				}
				st := d.Stats()
				switch {
				case tc.suspect && (suspects != 1 || st.Late != 0 || st.Failed != 1 || st.Counts.Applied[Suspect] != 1):
					t.Fatalf("%d suspects, %d late probes, %d failed, %d suspicions counted; want the target suspect, none late, 1 failed and counted", suspects, st.Late, st.Failed, st.Counts.Applied[Suspect])
				case !tc.suspect && (suspects != 0 || st.Late != 1 || st.Health != 1 || st.Failed != 0):
					t.Fatalf("%d suspects, %d late probes, %d failed, health %d; want none suspect, 1 late, none failed, health 1", suspects, st.Late, st.Failed, st.Health)
				case st.Acked != 0 || st.Indirect != 0:
					t.Fatalf("%d probes acked, %d indirect; want none", st.Acked, st.Indirect)
				}
			})
		})
	}
}

// slowAcks answers every ping after its delay, if the ping's deadline
// has not passed by then.
type slowAcks struct{ delay atomic.Int64 }

func (s *slowAcks) Ping(ctx context.Context, _ string, _ Message) (Message, error) {
	select {
	case <-time.After(time.Duration(s.delay.Load())):
		return Message{}, nil
	case <-ctx.Done():
		return Message{}, ctx.Err()
	}
}

func (s *slowAcks) PingReq(ctx context.Context, _, _ string, _ Message) (Message, error) {
	return s.Ping(ctx, "", Message{})
}

// TestSlowAcksStretchTheProbeTimeout: acks that take 300 ms, more than
// half the 500 ms timeout, raise the health score once, to a 1 s timeout
// that they fit in twice, and it holds there; acks at 10 ms bring it
// back to 0. No member is suspected meanwhile.
func TestSlowAcksStretchTheProbeTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &slowAcks{}
		tr.delay.Store(int64(300 * time.Millisecond))
		d, err := New(Config{Self: "self"}, tr, rand.New(rand.NewPCG(3, 4)), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []string{"b", "c", "d", "e"} {
			d.Add(m)
		}
		var scores []int
		for range 4 {
			d.probe(t.Context())
			scores = append(scores, d.Stats().Health)
		}
		tr.delay.Store(int64(10 * time.Millisecond))
		for range 2 {
			d.probe(t.Context())
			scores = append(scores, d.Stats().Health)
		}
		if want := []int{1, 1, 1, 1, 0, 0}; !slices.Equal(scores, want) {
			t.Fatalf("health after each probe: %v, want %v", scores, want)
		}
		if st := d.Stats(); st.Acked != 6 || st.Indirect+st.Failed+st.Late != 0 {
			t.Fatalf("probes: %d acked, %d indirect, %d failed, %d late; want 6 acked", st.Acked, st.Indirect, st.Failed, st.Late)
		}
		for _, m := range []string{"b", "c", "d", "e"} {
			if st, _ := d.State(m); st != Alive {
				t.Fatalf("%s is %v", m, st)
			}
		}
	})
}

// cutLink answers no ping, but every helper hears the target: the link
// between the prober and it is cut.
type cutLink struct{ silent }

func (cutLink) PingReq(context.Context, string, string, Message) (Message, error) {
	return Message{}, nil
}

// TestIndirectProbeCounted: a probe answered only through a helper
// suspects no one and is counted indirect.
func TestIndirectProbeCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, err := New(Config{Self: "self"}, cutLink{}, rand.New(rand.NewPCG(5, 6)), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []string{"b", "c", "d", "e"} {
			d.Add(m)
		}
		d.probe(t.Context())
		if st := d.Stats(); st.Indirect != 1 || st.Acked+st.Failed+st.Late != 0 || st.Counts.Applied[Suspect] != 0 {
			t.Fatalf("probes: %d acked, %d indirect, %d failed, %d late, %d suspicions; want 1 indirect", st.Acked, st.Indirect, st.Failed, st.Late, st.Counts.Applied[Suspect])
		}
	})
}
