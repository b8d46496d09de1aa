package gossip

import (
	"sync/atomic"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// Drops counts the message copies pubsub throws away under load: not sent
// to a peer whose outbound queue was full, not checked because the
// validation queue was full or throttled, not handed to a subscriber that
// was behind. Nothing is refused by them: a copy dropped here usually
// arrives by another path, and anti-entropy repairs the rest, but a
// growing count means a node is overloaded or its queues are too short.
// It is a pubsub.RawTracer (PubSubOptions installs it).
type Drops struct {
	quietTracer
	outbound, validation, undelivered atomic.Int64
}

// Counts returns the drops by where they happened.
func (d *Drops) Counts() map[string]int64 {
	return map[string]int64{
		"outbound_queue":   d.outbound.Load(),
		"validation_queue": d.validation.Load(),
		"subscriber":       d.undelivered.Load(),
	}
}

func (d *Drops) DropRPC(rpc *pubsub.RPC, _ peer.ID) {
	if n := len(rpc.GetPublish()); n > 0 {
		d.outbound.Add(int64(n))
	}
}

func (d *Drops) RejectMessage(_ *pubsub.Message, reason string) {
	if reason == pubsub.RejectValidationQueueFull || reason == pubsub.RejectValidationThrottled {
		d.validation.Add(1)
	}
}

func (d *Drops) UndeliverableMessage(*pubsub.Message) { d.undelivered.Add(1) }

// quietTracer is a pubsub.RawTracer that does nothing: tracers embed it
// and implement what they count.
type quietTracer struct{}

func (quietTracer) AddPeer(peer.ID, protocol.ID)             {}
func (quietTracer) RemovePeer(peer.ID)                       {}
func (quietTracer) OnNewOutboundStream(peer.ID, protocol.ID) {}
func (quietTracer) OnClosedOutboundStream(peer.ID)           {}
func (quietTracer) Join(string)                              {}
func (quietTracer) Leave(string)                             {}
func (quietTracer) Graft(peer.ID, string)                    {}
func (quietTracer) Prune(peer.ID, string)                    {}
func (quietTracer) ValidateMessage(*pubsub.Message)          {}
func (quietTracer) DeliverMessage(*pubsub.Message)           {}
func (quietTracer) DuplicateMessage(*pubsub.Message)         {}
func (quietTracer) ThrottlePeer(peer.ID)                     {}
func (quietTracer) RecvRPC(*pubsub.RPC)                      {}
func (quietTracer) SendRPC(*pubsub.RPC, peer.ID)             {}
func (quietTracer) DropRPC(*pubsub.RPC, peer.ID)             {}
func (quietTracer) RejectMessage(*pubsub.Message, string)    {}
func (quietTracer) UndeliverableMessage(*pubsub.Message)     {}

var _ pubsub.RawTracer = (*Drops)(nil)
