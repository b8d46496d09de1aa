package gossip

import (
	"sync/atomic"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Traffic counts what pubsub sends and receives: the RPCs and, in them,
// the entries (messages) and gossip control (IHAVE, IWANT, GRAFT, PRUNE,
// IDONTWANT), and the copies of entries that arrived again. An idle fleet
// should send little; a rate that grows with the fleet's size is gossip
// whose cost per node is not flat. It is a pubsub.RawTracer
// (PubSubOptions installs it).
type Traffic struct {
	quietTracer
	sent, received trafficCounts
	duplicates     atomic.Int64
}

type trafficCounts struct {
	rpcs, messages, ihave, iwant, graft, prune, idontwant atomic.Int64
}

func (c *trafficCounts) add(rpc *pubsub.RPC) {
	c.rpcs.Add(1)
	if n := len(rpc.GetPublish()); n > 0 {
		c.messages.Add(int64(n))
	}
	ctl := rpc.GetControl()
	if ctl == nil {
		return
	}
	for _, p := range []struct {
		n int
		c *atomic.Int64
	}{
		{len(ctl.GetIhave()), &c.ihave}, {len(ctl.GetIwant()), &c.iwant}, {len(ctl.GetGraft()), &c.graft},
		{len(ctl.GetPrune()), &c.prune}, {len(ctl.GetIdontwant()), &c.idontwant},
	} {
		if p.n > 0 {
			p.c.Add(int64(p.n))
		}
	}
}

func (c *trafficCounts) counts() map[string]int64 {
	return map[string]int64{
		"rpc": c.rpcs.Load(), "message": c.messages.Load(), "ihave": c.ihave.Load(), "iwant": c.iwant.Load(),
		"graft": c.graft.Load(), "prune": c.prune.Load(), "idontwant": c.idontwant.Load(),
	}
}

// Counts returns what was sent and received (by "sent" and "received",
// then by part: rpc, message, ihave, iwant, graft, prune, idontwant), and
// the duplicate copies of entries received.
func (t *Traffic) Counts() (byDirection map[string]map[string]int64, duplicates int64) {
	return map[string]map[string]int64{"sent": t.sent.counts(), "received": t.received.counts()}, t.duplicates.Load()
}

func (t *Traffic) SendRPC(rpc *pubsub.RPC, _ peer.ID) { t.sent.add(rpc) }
func (t *Traffic) RecvRPC(rpc *pubsub.RPC)            { t.received.add(rpc) }
func (t *Traffic) DuplicateMessage(*pubsub.Message)   { t.duplicates.Add(1) }

var _ pubsub.RawTracer = (*Traffic)(nil)
