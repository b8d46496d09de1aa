package node

import (
	"context"
	"sync"

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

// callThrough makes the call req to far, the targets this node holds no
// connection to, through relays (connected targets), in rounds: each
// round hands every target not reached yet to another relay, under one
// order ID (a target runs it once, however often it is handed it). Then
// it sends the order directly to the targets still not reached. The
// targets in near, connected ones, get the order directly meanwhile: an
// order runs once and its answer is kept, so one lost on the way (a
// stream that broke, a target slow to answer on a melted fleet) is asked
// for again, where a call's could not be. It hands each answer to record.
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
	pending := far
	for round := range relayRounds {
		if len(pending) == 0 || ctx.Err() != nil {
			break
		}
		// Each round a target meets another relay: the relays turn by
		// one group.
		turn := round * ((len(relays) + relayRounds - 1) / relayRounds) % len(relays)
		groups, left := shareOut(pending, append(relays[turn:len(relays):len(relays)], relays[:turn]...))
		var (
			mu   sync.Mutex
			next = left
			wg   sync.WaitGroup
		)
		for _, g := range groups {
			o := proto
			for _, t := range g.targets {
				o.Targets = append(o.Targets, plugins.OrderTarget{Node: t.id, Tribe: t.tribe})
			}
			sealed, err := plugins.SealOrder(&o, n.key)
			if err != nil {
				for _, t := range g.targets {
					record(t, plugins.Response{ID: o.ID, Code: plugins.CodeBadRequest, Error: err.Error()})
				}
				continue
			}
			wg.Go(func() {
				n.caller.Relay(ctx, g.via, &o, sealed, round == relayRounds-1, func(oc plugins.RelayOutcome) {
					t := byID[oc.Node]
					if oc.Again {
						mu.Lock()
						next = append(next, t)
						mu.Unlock()
						return
					}
					n.callsRelayed.Add(1)
					record(t, oc.Response)
				})
			})
		}
		wg.Wait()
		pending = next
	}
	// Straight to the targets no relay reached, under the same ID.
	n.sendOrders(ctx, proto, pending, record, true)
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
		o := proto
		for _, t := range chunk {
			o.Targets = append(o.Targets, plugins.OrderTarget{Node: t.id, Tribe: t.tribe})
		}
		sealed, err := plugins.SealOrder(&o, n.key)
		if err != nil {
			for _, t := range chunk {
				record(t, plugins.Response{ID: o.ID, Code: plugins.CodeBadRequest, Error: err.Error()})
			}
			continue
		}
		if again {
			n.callsRelayedAgain.Add(int64(len(chunk)))
		}
		wg.Go(func() { n.orderEach(ctx, &o, sealed, chunk, record) })
	}
}

// shareOut hands targets to relays in equal shares, at least
// relayMinBatch and at most relayBatch each, and returns what is left past
// that.
func shareOut(targets []callTarget, relays []peer.ID) (groups []relayGroup, left []callTarget) {
	per := min(relayBatch, max(relayMinBatch, (len(targets)+len(relays)-1)/len(relays)))
	for _, r := range relays {
		if len(targets) == 0 {
			break
		}
		k := min(per, len(targets))
		groups = append(groups, relayGroup{via: r, targets: targets[:k:k]})
		targets = targets[k:]
	}
	return groups, targets
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
