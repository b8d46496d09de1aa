package gossip

import (
	"testing"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	pb "github.com/libp2p/go-libp2p-pubsub/pb"
)

func TestDropsCountOnlyLostMessageCopies(t *testing.T) {
	var d Drops
	msg := &pubsub.Message{Message: &pb.Message{Data: []byte("x")}}
	// Two messages not sent to a peer; an RPC of control only is not a
	// lost message.
	d.DropRPC(&pubsub.RPC{RPC: pb.RPC{Publish: []*pb.Message{msg.Message, msg.Message}}}, "")
	d.DropRPC(&pubsub.RPC{RPC: pb.RPC{Control: &pb.ControlMessage{}}}, "")
	// Load drops count; a refusal by our validator is counted by the
	// replica, not here.
	d.RejectMessage(msg, pubsub.RejectValidationQueueFull)
	d.RejectMessage(msg, pubsub.RejectValidationThrottled)
	d.RejectMessage(msg, pubsub.RejectValidationFailed)
	d.RejectMessage(msg, pubsub.RejectInvalidSignature)
	d.UndeliverableMessage(msg)

	got := d.Counts()
	want := map[string]int64{"outbound_queue": 2, "validation_queue": 2, "subscriber": 1}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("counts %v, want exactly %v", got, want)
	}
}
