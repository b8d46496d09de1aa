package node

import (
	"context"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/plugins"
)

// A fan-out to many hosts this node holds no connection to would open one
// connection each: a Noise handshake, on this node's one core, per host.
// Past CallRelayFrom such hosts, each connected target (a relay) is handed
// a share of them as an order this node signs (plugins.RelayProtocol):
// the relays make those calls over their own connections, in parallel,
// and pass back each target's signed answer. What a relay could not hand
// over is then sent to its target directly; an order runs once on a node
// however often it arrives.

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
// node, those it holds a connection to, and everyone when fewer than from
// are not connected or none is) and groups of the others, each for one
// connected target taken in the order given (relays spread a call's
// load: the caller shuffles them). from 0 turns relaying off.
func relayPlan(targets []callTarget, self peer.ID, connected func(peer.ID) bool, from int) (direct []callTarget, groups []relayGroup) {
	var far, relays []callTarget
	for _, t := range targets {
		switch {
		case t.id == self:
			direct = append(direct, t)
		case connected(t.id):
			direct = append(direct, t)
			relays = append(relays, t)
		default:
			far = append(far, t)
		}
	}
	if from <= 0 || len(far) < from || len(relays) == 0 {
		return append(direct, far...), nil
	}
	per := min(relayBatch, max(relayMinBatch, (len(far)+len(relays)-1)/len(relays)))
	for _, r := range relays {
		if len(far) == 0 {
			break
		}
		k := min(per, len(far))
		groups = append(groups, relayGroup{via: r.id, targets: far[:k:k]})
		far = far[k:]
	}
	return append(direct, far...), groups
}

// callThrough makes the call req to g's targets through g's relay, then
// directly to the targets the relay did not hand it to, and hands each
// answer to record.
func (n *Node) callThrough(ctx context.Context, g relayGroup, req plugins.Request, record func(callTarget, plugins.Response)) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = n.now().Add(plugins.DefaultTimeout)
	}
	o := &plugins.Order{ID: req.ID, Plugin: req.Plugin, Method: req.Method, Args: req.Args, Deadline: dl.UnixMilli()}
	byID := make(map[peer.ID]callTarget, len(g.targets))
	for _, t := range g.targets { // distinct nodes (callTargets)
		byID[t.id] = t
		o.Targets = append(o.Targets, plugins.OrderTarget{Node: t.id, Tribe: t.tribe})
	}
	sealed, err := plugins.SealOrder(o, n.key)
	if err != nil {
		for _, t := range byID {
			record(t, plugins.Response{ID: o.ID, Code: plugins.CodeBadRequest, Error: err.Error()})
		}
		return
	}
	var again []callTarget
	n.caller.Relay(ctx, g.via, o, sealed, func(oc plugins.RelayOutcome) {
		t := byID[oc.Node]
		if oc.Again {
			again = append(again, t)
			return
		}
		n.callsRelayed.Add(1)
		record(t, oc.Response)
	})
	n.relayAgain(ctx, o, sealed, again, record)
}

// relayAgain sends the order o (sealed) to each of targets directly.
func (n *Node) relayAgain(ctx context.Context, o *plugins.Order, sealed []byte, targets []callTarget, record func(callTarget, plugins.Response)) {
	if len(targets) == 0 {
		return
	}
	n.callsRelayedAgain.Add(int64(len(targets)))
	again := plugins.FanOut(ctx, targets, n.cfg.CallParallel, func(ctx context.Context, t callTarget) plugins.Response {
		if !n.isConnected(t.id) {
			n.learnAddrs(t.id, t.addrs)
		}
		defer n.useCallConn(t.id)()
		return n.caller.Order(ctx, t.id, o, sealed)
	}, record)
	n.callDialRetries.Add(int64(again))
}
