package node

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/plugins"
)

// A fan-out to many hosts this node holds no connection to would open one
// connection each: a Noise handshake, on this node's one core, per host.
// Past CallRelayFrom such hosts, each connected target (a relay) is handed
// a share of them as an order this node signs (plugins.RelayProtocol):
// the relays make those calls over their own connections, in parallel,
// and pass back each target's signed answer. Targets a relay holds no
// connection to are handed to other relays, then to relays that dial
// them, and what no relay reached is sent its order directly; an order ID
// runs once on a node however often it arrives.

// relayBatch bounds the targets one relay is handed: past relays ×
// relayBatch, the rest are called directly. relayMinBatch is the least a
// relay is handed: fewer relays, each with more, rather than one hand-off
// per target.
const (
	relayBatch    = 64
	relayMinBatch = 4
)

// relayGroup is the targets one relay is handed.
type relayGroup struct {
	via     peer.ID
	targets []callTarget
}

// relayPlan splits a fan-out's targets into those called directly (this
// node and those it holds a connection to) and those to hand to relays
// (far), with the relays: the connected targets, in the order given (the
// caller shuffles them: relays spread a call's load). Everyone is called
// directly when fewer than from targets are far, or no target is
// connected; from 0 turns relaying off.
func relayPlan(targets []callTarget, self peer.ID, connected func(peer.ID) bool, from int) (direct, far []callTarget, relays []peer.ID) {
	for _, t := range targets {
		switch {
		case t.id == self:
			direct = append(direct, t)
		case connected(t.id):
			direct = append(direct, t)
			relays = append(relays, t.id)
		default:
			far = append(far, t)
		}
	}
	if from <= 0 || len(far) < from || len(relays) == 0 {
		return append(direct, far...), nil, nil
	}
	return direct, far, relays
}

// relayRounds is how many times a fan-out hands out the targets no relay
// has reached yet, each time to other relays: the first rounds to relays
// that call only the targets they hold a connection to (plugins.ModeNear:
// on a fleet whose handshakes time out, as a melted one, a dial fails
// wherever it is made, but each member holds connections to many), the
// last to relays that dial. What is left is called directly.
const relayRounds = 3

// relayGather is how long the targets relays hand back are gathered
// before they are handed out again, together: a relay in near mode notes
// the targets it holds no connection to as soon as it reads the order.
const relayGather = 100 * time.Millisecond

// callThrough makes the call req to far, the targets this node holds no
// connection to, through relays (connected targets), in rounds: a target
// a relay hands back (it could not reach it) goes to another relay of
// the next round, and after the last round gets the order directly, under
// one order ID (a target runs it once, however often it is handed it).
// Targets move on as soon as they are handed back, not when every relay
// of their round is done: on a melted fleet one relay's slow target held
// a round, and every target of the rounds behind it, until the call's
// deadline. The targets in near, connected ones, get the order directly
// meanwhile: an order runs once and its answer is kept, so one lost on
// the way (a stream that broke, a target slow to answer on a melted
// fleet) is asked for again, where a call's could not be. It hands each
// answer to record.
func (n *Node) callThrough(ctx context.Context, near, far []callTarget, relays []peer.ID, req plugins.Request, record func(callTarget, plugins.Response)) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = n.now().Add(plugins.DefaultTimeout)
	}
	proto := plugins.Order{ID: req.ID, Plugin: req.Plugin, Method: req.Method, Args: req.Args, Deadline: dl.UnixMilli()}
	var direct sync.WaitGroup
	defer direct.Wait()
	direct.Go(func() { n.sendOrders(ctx, proto, near, record, false) })
	byID := make(map[peer.ID]callTarget, len(far))
	for _, t := range far { // distinct nodes (callTargets)
		byID[t.id] = t
	}
	relay := func(round int, via peer.ID, targets []callTarget, back func(callTarget)) {
		o, sealed, ok := n.sealOrder(proto, targets, record)
		if !ok {
			return
		}
		n.caller.Relay(ctx, via, o, sealed, round == relayRounds-1, func(oc plugins.RelayOutcome) {
			t := byID[oc.Node]
			if oc.Again {
				back(t)
				return
			}
			n.callsRelayed.Add(1)
			record(t, oc.Response)
		})
	}
	scheduleRelays(ctx, far, relays, relay, func(ts []callTarget) {
		// Straight to the targets no relay reached, under the same ID
		// (with the call's time up, that records each as timed out).
		again := ctx.Err() == nil
		direct.Go(func() { n.sendOrders(ctx, proto, ts, record, again) })
	})
}

// scheduleRelays hands the targets far out to relays in rounds (relay
// makes one hand-off, and calls back with each target it hands back),
// each target handed back going to another relay of the next round,
// after relayGather with the others handed back meanwhile, and after the
// last round (or once ctx ended) to direct. It returns when every
// hand-off has ended and nothing waits.
func scheduleRelays(ctx context.Context, far []callTarget, relays []peer.ID,
	relay func(round int, via peer.ID, targets []callTarget, back func(callTarget)), direct func([]callTarget)) {
	type back struct {
		t     callTarget
		round int // the round it goes to
	}
	var (
		backs   = make(chan back, len(far)) // a target is in one place at a time
		done    = make(chan struct{})
		streams int                           // hand-offs in flight
		waiting [relayRounds + 1][]callTarget // handed back, by the round they go to (the last: direct)
		next    [relayRounds]int              // each round's next relay
	)
	// Each round a target meets another relay: the rounds start a third
	// of the relays apart.
	for r := range relayRounds {
		next[r] = r * ((len(relays) + relayRounds - 1) / relayRounds)
	}
	met := map[peer.ID][]peer.ID{} // target: the relays it was handed to
	handOut := func(round int, targets []callTarget) {
		groups, left, from := assign(targets, relays, next[round], func(t callTarget, via peer.ID) bool {
			return slices.Contains(met[t.id], via)
		})
		next[round] = from
		for _, t := range left {
			backs <- back{t, round + 1}
		}
		for _, g := range groups {
			for _, t := range g.targets {
				met[t.id] = append(met[t.id], g.via)
			}
		}
		for _, g := range groups {
			streams++
			go func() {
				defer func() { done <- struct{}{} }()
				relay(round, g.via, g.targets, func(t callTarget) { backs <- back{t, round + 1} })
			}()
		}
	}
	flush := func() {
		for r, ts := range waiting {
			waiting[r] = nil
			switch {
			case len(ts) == 0:
			case r < relayRounds && ctx.Err() == nil:
				handOut(r, ts)
			default:
				direct(ts)
			}
		}
	}
	handOut(0, far)
	var gather <-chan time.Time
	for {
		if streams == 0 && len(backs) == 0 {
			if !slices.ContainsFunc(waiting[:], func(ts []callTarget) bool { return len(ts) > 0 }) {
				return
			}
			flush() // nothing else to wait for
			continue
		}
		select {
		case b := <-backs:
			waiting[b.round] = append(waiting[b.round], b.t)
			if gather == nil {
				gather = time.After(relayGather)
			}
		case <-gather:
			gather = nil
			flush()
		case <-done:
			streams--
		}
	}
}

// sendOrders sends the order proto to each of targets directly, in
// orders of at most plugins.MaxOrderTargets targets each; again counts
// them as targets relays did not reach.
func (n *Node) sendOrders(ctx context.Context, proto plugins.Order, targets []callTarget, record func(callTarget, plugins.Response), again bool) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for len(targets) > 0 {
		k := min(len(targets), plugins.MaxOrderTargets)
		chunk := targets[:k]
		targets = targets[k:]
		o, sealed, ok := n.sealOrder(proto, chunk, record)
		if !ok {
			continue
		}
		if again {
			n.callsRelayedAgain.Add(int64(len(chunk)))
		}
		wg.Go(func() { n.orderEach(ctx, o, sealed, chunk, record) })
	}
}

// assign hands targets to relays in equal shares of at least
// relayMinBatch and at most relayBatch, filling the relays in turn from
// relays[from] and passing over, for each target, the relays it met
// before; it returns the groups, the targets left past that, and where
// the next assignment starts.
func assign(targets []callTarget, relays []peer.ID, from int, met func(callTarget, peer.ID) bool) (groups []relayGroup, left []callTarget, next int) {
	if len(relays) == 0 {
		return nil, targets, from
	}
	per := min(relayBatch, max(relayMinBatch, (len(targets)+len(relays)-1)/len(relays)))
	at := map[peer.ID]int{} // relay: its group
	for _, t := range targets {
		placed := false
		for k := range len(relays) {
			via := relays[(from+k)%len(relays)]
			i, ok := at[via]
			if (ok && len(groups[i].targets) >= per) || met(t, via) {
				continue
			}
			if !ok {
				i = len(groups)
				at[via] = i
				groups = append(groups, relayGroup{via: via})
			}
			groups[i].targets = append(groups[i].targets, t)
			placed = true
			break
		}
		if !placed {
			left = append(left, t)
		}
		// The relay whose turn it is passes the turn on once full.
		for range len(relays) {
			if i, ok := at[relays[from%len(relays)]]; !ok || len(groups[i].targets) < per {
				break
			}
			from++
		}
	}
	return groups, left, from
}

// sealOrder is proto for targets, signed by this node; if it cannot be
// signed, each target is recorded failed.
func (n *Node) sealOrder(proto plugins.Order, targets []callTarget, record func(callTarget, plugins.Response)) (*plugins.Order, []byte, bool) {
	o := proto
	for _, t := range targets {
		o.Targets = append(o.Targets, plugins.OrderTarget{Node: t.id, Tribe: t.tribe})
	}
	sealed, err := plugins.SealOrder(&o, n.key)
	if err != nil {
		for _, t := range targets {
			record(t, plugins.Response{ID: o.ID, Code: plugins.CodeBadRequest, Error: err.Error()})
		}
		return nil, nil, false
	}
	return &o, sealed, true
}

// orderEach sends the order o (sealed) to each of targets directly.
func (n *Node) orderEach(ctx context.Context, o *plugins.Order, sealed []byte, targets []callTarget, record func(callTarget, plugins.Response)) {
	again := plugins.FanOut(ctx, targets, n.cfg.CallParallel, func(ctx context.Context, t callTarget) plugins.Response {
		if !n.isConnected(t.id) {
			n.learnAddrs(t.id, t.addrs)
		}
		defer n.useCallConn(t.id)()
		return n.caller.Order(ctx, t.id, o, sealed)
	}, record)
	n.callDialRetries.Add(int64(again))
}
