package node

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node/api/events"
)

// The event stream (`tribe watch`): every applied state change goes
// through events.Translate, and a loop samples the liveness of every known
// node while anyone watches. Both publish to the hub, which never blocks:
// a watcher that falls behind loses its oldest events, not the replica's
// time.

// livenessSampleEvery is how often liveness is sampled for watchers, at
// most; a shorter probe interval samples faster, so a suspect phase
// (at least four probe intervals long) is always seen.
const livenessSampleEvery = time.Second

// startEvents makes the hub and starts feeding it. It runs in Start, before
// the node talks to anyone; the authority's watchers, registered in New,
// have seen each change first, so names are current.
func (n *Node) startEvents() {
	n.events = events.NewHub(events.DefaultBuffer)
	rules := n.rules
	names := func(id string) string {
		p, err := peer.Decode(id)
		if err != nil {
			return ""
		}
		if name := n.boundName(rules(), p); name != "" {
			return name
		}
		rec, _ := n.nodeNamed(p) // pending nodes: what they call themselves
		return rec.Name
	}
	value := func(s *gossip.Signed) []byte {
		switch {
		case s == nil || s.Deleted:
			return nil
		case s.Value == nil:
			return []byte{}
		}
		return s.Value
	}
	cancel := n.replica.Watch("", func(c gossip.Change) {
		if !n.events.Active() {
			return
		}
		n.events.Publish(events.Translate(events.Change{Key: c.Key, Old: value(c.Old), New: value(c.New)}, n.now(), names)...)
	})
	n.spawn(func() {
		defer cancel()
		n.livenessEvents(names)
	})
}

// livenessEvents samples the liveness of every node with a record, other
// than this one, and publishes the transitions, while anyone watches.
func (n *Node) livenessEvents(names events.Names) {
	tracker := events.NewLiveness()
	every := min(livenessSampleEvery, n.cfg.ProbeInterval)
	for n.sleep(every) {
		if !n.events.Active() {
			tracker.Reset()
			continue
		}
		var samples []events.Sample
		for _, e := range n.replica.Prefix(nodesPrefix) {
			id, err := peer.Decode(strings.TrimPrefix(e.Key, nodesPrefix))
			if err != nil || id == n.host.ID() {
				continue
			}
			samples = append(samples, events.Sample{Node: id.String(), Name: names(id.String()), State: n.liveness(id)})
		}
		n.events.Publish(tracker.Observe(samples, n.now())...)
		n.livenessSamples.Add(1)
	}
}

// Watch implements api.Agent.
func (n *Node) Watch(ctx context.Context, prefix string, emit func(*events.Event)) error {
	if n.events == nil {
		return errors.New("node: not started")
	}
	sub := n.events.Subscribe(prefix)
	defer sub.Close()
	emit(nil)
	for {
		e, err := sub.Next(ctx)
		switch {
		case err == nil:
			emit(&e)
		case errors.Is(err, ctx.Err()):
			return nil
		default:
			return err
		}
	}
}

// stopWatches ends every watch, so that a shutdown does not wait on
// streams that never end by themselves.
func (n *Node) stopWatches() {
	if n.events != nil {
		n.events.Close()
	}
}
