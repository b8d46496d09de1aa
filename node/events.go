package node

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/gossip/swim"
	"github.com/tribeagent/tribe/node/api/events"
)

// The event stream (`tribe watch`): every applied state change goes
// through events.Translate; liveness changes come from the failure
// detector as it makes them (noteLiveness), and a loop samples the
// liveness of every known node while anyone watches, for what the
// detector does not say (a record that says left, a force-leave, a new
// node). All publish to the hub, which never blocks: a watcher that falls
// behind loses its oldest events, not the replica's time.

// livenessSampleEvery is how often liveness is sampled for watchers.
const livenessSampleEvery = time.Second

// liveTracker is the liveness tracker the sampler and the detector's
// changes share.
type liveTracker struct {
	mu    sync.Mutex
	t     *events.Liveness
	names events.Names
}

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
	n.watchLive.t, n.watchLive.names = events.NewLiveness(), names
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
		evs := events.Translate(events.Change{Key: c.Key, Old: value(c.Old), New: value(c.New)}, n.now(), names)
		if c.New != nil && strings.HasPrefix(c.Key, nodesPrefix) && !rules().Counts(c.New.Author) {
			// What a node that does not count says of its plugins is
			// not so (it loads nothing for a tribe), and any peer can
			// write such a record: thousands of made-up plugin states
			// in one would push every watcher's other events out.
			evs = slices.DeleteFunc(evs, func(e events.Event) bool { return e.Type == events.PluginState })
		}
		n.events.Publish(evs...)
	})
	n.spawn(func() {
		defer cancel()
		n.livenessEvents()
	})
}

// livenessEvents samples the liveness of every known node while anyone
// watches, and sleeps until someone does (a sample a second woke every
// idle agent to find nobody watching).
func (n *Node) livenessEvents() {
	for n.events.WaitActive(n.ctx) {
		for n.events.Active() && n.sleep(livenessSampleEvery) {
			n.sampleLiveness()
		}
		n.sampleLiveness() // nobody watches: the baseline is forgotten
	}
}

// sampleLiveness takes the liveness of every node with a record, other
// than this one, and publishes the transitions since the last sample (the
// first sets the baseline); while nobody watches, it forgets the baseline.
func (n *Node) sampleLiveness() {
	// Under the lock: two samples (the loop's and a new watcher's) or a
	// sample and a noted change are taken in the order they are observed,
	// and a watcher that just came is never left without a baseline.
	n.watchLive.mu.Lock()
	defer n.watchLive.mu.Unlock()
	if !n.events.Active() {
		n.watchLive.t.Reset()
		return
	}
	var samples []events.Sample
	for _, e := range n.replica.Prefix(nodesPrefix) {
		id, err := peer.Decode(strings.TrimPrefix(e.Key, nodesPrefix))
		if err != nil || id == n.host.ID() {
			continue
		}
		samples = append(samples, events.Sample{Node: id.String(), Name: n.watchLive.names(id.String()), State: n.liveness(id)})
	}
	n.events.Publish(n.watchLive.t.Observe(samples, n.now())...)
}

// noteLiveness publishes what the failure detector just changed, in the
// order it changed it (the detector delivers one batch at a time): a
// suspect phase shorter than the sampling period is still seen. A node
// whose record says it left stays left whatever the detector says.
func (n *Node) noteLiveness(changes []swim.Change) {
	if n.events == nil || !n.events.Active() {
		return
	}
	now := n.now()
	var evs []events.Event
	n.watchLive.mu.Lock()
	for _, c := range changes {
		id := peer.ID(c.Node)
		v := n.view(id)
		if v.record == 0 {
			continue // no record here: not a node the views show
		}
		state := swimLiveness[c.State]
		if v.state() == Left {
			state = Left
		}
		if e, ok := n.watchLive.t.Note(events.Sample{Node: id.String(), Name: n.watchLive.names(id.String()), State: state}, now); ok {
			evs = append(evs, e)
		}
	}
	n.events.Publish(evs...)
	n.watchLive.mu.Unlock()
}

// Watch implements api.Agent.
func (n *Node) Watch(ctx context.Context, prefix string, emit func(*events.Event)) error {
	if n.events == nil {
		return errors.New("node: not started")
	}
	sub := n.events.Subscribe(prefix)
	defer sub.Close()
	// The baseline before the watcher hears it is watching: a change right
	// after is an event, not the baseline.
	n.sampleLiveness()
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
