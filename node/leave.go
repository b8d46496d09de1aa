package node

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node/api"
)

// forcedPrefix holds force-leave entries: forced/<peer>, trusted writers
// only (gossip.Kinds).
const forcedPrefix = "forced/"

// leavePeers is how many connected peers a leaving node hands its
// farewell record to at once; one acknowledgement is enough.
const leavePeers = 3

// say farewell: tell the failure detector's members this node leaves
// (so they hold it left, not suspect), write this node's record with left
// and left_at, and hand it to a few connected peers, waiting (at most
// LeaveTimeout) for one to store it. Pubsub spreads it too, and
// anti-entropy to whoever both miss. It returns how many peers
// acknowledged it; a node with no peer has nobody to tell.
func (n *Node) farewell(ctx context.Context) (int, error) {
	n.leaveMu.Lock()
	if n.leaving {
		n.leaveMu.Unlock()
		return 0, nil
	}
	n.leaving = true
	n.leaveMu.Unlock()
	if n.swim.d != nil {
		n.swim.d.Leave(ctx)
	}

	n.recordMu.Lock()
	n.leftAt = n.now()
	b, err := n.encodeRecord(n.facts.get())
	var s *gossip.Signed
	if err == nil {
		s, err = n.replica.Put(ctx, nodesPrefix+n.host.ID().String(), b)
	}
	n.recordMu.Unlock()
	if err != nil {
		return 0, fmt.Errorf("node: leave: write own record: %w", err)
	}
	peers := n.ConnectedPeers()
	if len(peers) == 0 {
		return 0, nil
	}
	n.rngMu.Lock()
	n.rng.Shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
	n.rngMu.Unlock()
	peers = peers[:min(len(peers), leavePeers)]

	ctx, cancel := context.WithTimeout(ctx, n.cfg.LeaveTimeout)
	defer cancel()
	errs := make(chan error, len(peers))
	for _, p := range peers {
		go func() { errs <- n.replica.Push(ctx, p, s) }()
	}
	acked := 0
	var failed []error
	for range peers {
		if err := <-errs; err != nil {
			failed = append(failed, err)
			continue
		}
		acked++
		cancel() // one is enough; the rest are stopped
	}
	if acked == 0 {
		return 0, fmt.Errorf("node: leave: no peer acknowledged the farewell within %v (it still spreads by gossip): %w", n.cfg.LeaveTimeout, errors.Join(failed...))
	}
	return acked, nil
}

// LeaveCluster implements api.Agent: `tribe leave` with no arguments.
// This node says farewell and then stops (Run returns).
func (n *Node) LeaveCluster(ctx context.Context) (api.LeaveResult, error) {
	acked, err := n.farewell(ctx)
	res := api.LeaveResult{ID: n.host.ID().String(), Name: n.cfg.Name, Acked: acked}
	if err != nil {
		res.Error = err.Error()
		n.log.Warn("leaving", "err", err)
	}
	n.leaveOnce.Do(func() { close(n.leaveReq) })
	return res, nil
}

// Leaving is closed once LeaveCluster was called: the agent should stop.
func (n *Node) Leaving() <-chan struct{} { return n.leaveReq }

// Crash closes the node as a crash would: no farewell, so peers see it
// suspect and then dead, and the entries it applied but had not stored
// yet are not stored (see gossip.Replica.Crash). For the simulator and
// tests.
func (n *Node) Crash() error {
	n.crashed.Store(true)
	return n.Close()
}

// ForceLeave implements api.Agent: a trusted writer marks nodes as left
// and reaped everywhere at once (forced/<peer>), until each writes a newer
// record. A live node does so at once: force-leave is for nodes that are
// gone.
func (n *Node) ForceLeave(ctx context.Context, nodes []string) ([]api.Node, error) {
	ids, err := n.forceLeaveTargets(nodes)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if id == n.host.ID() {
			return nil, api.BadRequest(errors.New("force-leave names this node itself: use `tribe leave`"))
		}
		if err := n.replica.Trust().Authorize(forcedPrefix+id.String(), n.host.ID()); err != nil {
			return nil, writeErr(err)
		}
	}
	out := []api.Node{}
	for i, id := range ids {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("node: force-leave: stopped after %d of %d nodes: %w", i, len(ids), err)
		}
		if _, err := n.replica.Put(ctx, forcedPrefix+id.String(), []byte("{}")); err != nil {
			return nil, writeErr(err)
		}
		rec, _ := n.nodeNamed(id)
		l := n.liveness(id)
		out = append(out, api.Node{ID: id.String(), Name: rec.Name, Addrs: rec.Addrs, Liveness: l, Alive: l == Alive,
			Admission: string(n.rules().Status(id))})
	}
	return out, nil
}

// forceLeaveTargets resolves names as resolve does, except that a name
// several nodes carry (a host rebuilt under one name, under open trust)
// means those of them that are not alive: force-leave is for the gone.
func (n *Node) forceLeaveTargets(names []string) ([]peer.ID, error) {
	names, err := distinctNames(names)
	if err != nil {
		return nil, err
	}
	rules := n.rules()
	var out []peer.ID
	for _, s := range names {
		if _, err := peer.Decode(s); err != nil {
			if cands := n.named(rules, s); len(cands) > 1 {
				gone := slices.DeleteFunc(slices.Clone(cands), func(id peer.ID) bool { return n.liveness(id) == Alive })
				if len(gone) > 0 {
					out = append(out, gone...)
					continue
				}
			}
		}
		ids, err := n.resolve([]string{s})
		if err != nil {
			return nil, err
		}
		out = append(out, ids...)
	}
	return distinct(out), nil
}

// watchForced asks the record loop to refute a force-leave of this node
// (memberlist's refutation): a node that is up writes a newer record.
func (n *Node) watchForced() func() {
	self := forcedPrefix + n.host.ID().String()
	return n.replica.Watch(forcedPrefix, func(c gossip.Change) {
		if c.Key == self && c.New != nil && !c.New.Deleted {
			select {
			case n.refute <- struct{}{}:
			default:
			}
		}
	})
}

// refuteForceLeave rewrites this node's record if a force-leave of it is
// newer, so that it counts as back.
func (n *Node) refuteForceLeave(ctx context.Context) error {
	n.recordMu.Lock()
	defer n.recordMu.Unlock()
	f, ok := n.replica.Get(forcedPrefix + n.host.ID().String())
	if !ok || !n.leftAt.IsZero() {
		return nil
	}
	if rec, ok := n.replica.Get(nodesPrefix + n.host.ID().String()); ok && rec.HLC > f.HLC {
		return nil
	}
	b, err := n.encodeRecord(n.facts.get())
	if err != nil {
		return err
	}
	n.log.Info("a trusted writer force-left this node; announcing it is here", "by", f.Author)
	_, err = n.replica.Put(ctx, nodesPrefix+n.host.ID().String(), b)
	return err
}
