package gossip

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/p2p/net/mock"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	pb "github.com/libp2p/go-libp2p-pubsub/pb"
)

func TestTrafficCountsRPCsByPart(t *testing.T) {
	var tr Traffic
	msg := &pb.Message{Data: []byte("x")}
	tr.SendRPC(&pubsub.RPC{RPC: pb.RPC{Publish: []*pb.Message{msg, msg}}}, "")
	tr.SendRPC(&pubsub.RPC{RPC: pb.RPC{Control: &pb.ControlMessage{
		Ihave: []*pb.ControlIHave{{}, {}, {}}, Graft: []*pb.ControlGraft{{}}}}}, "")
	tr.RecvRPC(&pubsub.RPC{RPC: pb.RPC{Publish: []*pb.Message{msg}, Control: &pb.ControlMessage{
		Iwant: []*pb.ControlIWant{{}}, Prune: []*pb.ControlPrune{{}, {}}, Idontwant: []*pb.ControlIDontWant{{}}}}})
	tr.RecvRPC(&pubsub.RPC{RPC: pb.RPC{Subscriptions: []*pb.RPC_SubOpts{{}}}})
	tr.DuplicateMessage(&pubsub.Message{Message: msg})

	got, dups := tr.Counts()
	want := map[string]map[string]int64{
		"sent":     {"rpc": 2, "message": 2, "ihave": 3, "iwant": 0, "graft": 1, "prune": 0, "idontwant": 0},
		"received": {"rpc": 2, "message": 1, "ihave": 0, "iwant": 1, "graft": 0, "prune": 2, "idontwant": 1},
	}
	for dir, parts := range want {
		for part, n := range parts {
			if got[dir][part] != n {
				t.Errorf("%s %s = %d, want %d", dir, part, got[dir][part], n)
			}
		}
		if len(got[dir]) != len(parts) {
			t.Errorf("%s has parts %v, want exactly %v", dir, got[dir], parts)
		}
	}
	if dups != 1 {
		t.Errorf("duplicates = %d, want 1", dups)
	}
}

// TestTrafficOfAPublish: an entry one replica writes is counted as sent
// there and as received by its peer.
func TestTrafficOfAPublish(t *testing.T) {
	mn, nets, traffic := tracedNets(t, 2)
	n, m := nets[0], nets[1]
	if _, err := mn.LinkPeers(n.h.ID(), m.h.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := mn.ConnectPeers(n.h.ID(), m.h.ID()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(m.r.topic.ListPeers()) > 0 && len(n.r.topic.ListPeers()) > 0 })
	if _, err := m.r.Put(context.Background(), "tribes/t", nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, ok := n.r.Get("tribes/t"); return ok })
	sent, _ := traffic[1].Counts()
	received, _ := traffic[0].Counts()
	if sent["sent"]["message"] < 1 || sent["sent"]["rpc"] < 1 {
		t.Errorf("the writer counted %v sent, want the entry", sent["sent"])
	}
	if received["received"]["message"] < 1 || received["received"]["rpc"] < 1 {
		t.Errorf("its peer counted %v received, want the entry", received["received"])
	}
}

// TestGossipDoesNotGrowWithPeers: in a fleet where every node holds many
// connections (24 replicas, each connected to all others), one entry of
// a few kilobytes costs each node at most gossipPeers IHAVEs at each of
// gossipHeartbeats heartbeats, not a quarter of its peers at each of 3
// (pubsub's default), and no IDONTWANT; and it still reaches every node.
func TestGossipDoesNotGrowWithPeers(t *testing.T) {
	if testing.Short() {
		t.Skip("24 replicas and 4 s of pubsub heartbeats")
	}
	const n = 24
	mn, nets, traffic := tracedNets(t, n)
	if err := mn.LinkAll(); err != nil {
		t.Fatal(err)
	}
	if err := mn.ConnectAllButSelf(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		for _, m := range nets {
			if len(m.r.topic.ListPeers()) != n-1 {
				return false
			}
		}
		return true
	})
	time.Sleep(2 * pubsub.GossipSubHeartbeatInterval) // the meshes form
	before := make([]map[string]int64, n)
	for i := range traffic {
		c, _ := traffic[i].Counts()
		before[i] = c["sent"]
	}
	value := bytes.Repeat([]byte("x"), 3<<10) // past pubsub's IDONTWANT threshold
	if _, err := nets[0].r.Put(context.Background(), "tribes/t", value); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		for _, m := range nets {
			if _, ok := m.r.Get("tribes/t"); !ok {
				return false
			}
		}
		return true
	})
	// Every heartbeat that may still gossip it, and one more.
	time.Sleep(time.Duration(pubsub.GossipSubHistoryGossip+1) * pubsub.GossipSubHeartbeatInterval)
	for i := 1; i < n; i++ {
		c, _ := traffic[i].Counts()
		ihave, idontwant := c["sent"]["ihave"]-before[i]["ihave"], c["sent"]["idontwant"]-before[i]["idontwant"]
		if ihave > gossipPeers*gossipHeartbeats || idontwant != 0 {
			t.Errorf("node %d sent %d IHAVEs (want at most %d) and %d IDONTWANTs (want 0) for one entry",
				i, ihave, gossipPeers*gossipHeartbeats, idontwant)
		}
	}
}

// tracedNets starts n replicas on one mock network, not linked yet, each
// with a Traffic tracer on its pubsub.
func tracedNets(t *testing.T, n int) (mocknet.Mocknet, []*testNet, []Traffic) {
	t.Helper()
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	nets, traffic := make([]*testNet, n), make([]Traffic, n)
	for i := range nets {
		h, err := genPeer(mn)
		if err != nil {
			t.Fatal(err)
		}
		nets[i] = &testNet{mn: mn, psOpts: []pubsub.Option{pubsub.WithRawTracer(&traffic[i])}}
		nets[i].start(t, h)
	}
	return mn, nets, traffic
}
