package node

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// TestStaleTopicLinks: a connected peer missing from the topic is stale
// once it has been missing for the grace; one back in the topic, or gone,
// starts over.
func TestStaleTopicLinks(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	const grace = 10 * time.Second
	missing := map[peer.ID]time.Time{}
	check := func(at time.Duration, connected []peer.ID, inTopic []peer.ID, want []peer.ID) {
		t.Helper()
		in := map[peer.ID]bool{}
		for _, p := range inTopic {
			in[p] = true
		}
		got := staleTopicLinks(connected, in, missing, t0.Add(at), grace)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("at %v: stale %v, want %v (missing %v)", at, got, want, missing)
		}
	}
	check(0, []peer.ID{"a", "b", "c"}, []peer.ID{"a"}, nil)                  // b, c missing from now
	check(5*time.Second, []peer.ID{"a", "b", "c"}, []peer.ID{"a", "c"}, nil) // c is back
	check(9*time.Second, []peer.ID{"a", "b", "c"}, []peer.ID{"a"}, nil)      // c missing again, from 9 s
	check(10*time.Second, []peer.ID{"a", "b", "c"}, []peer.ID{"a"}, []peer.ID{"b"})
	check(11*time.Second, []peer.ID{"a", "b", "c"}, []peer.ID{"a"}, nil) // b starts over after its relink
	check(15*time.Second, []peer.ID{"a", "b"}, []peer.ID{"a"}, nil)      // c disconnected: forgotten
	check(25*time.Second, []peer.ID{"a", "b", "c"}, []peer.ID{"a"}, []peer.ID{"b"})
	if _, ok := missing["c"]; !ok || len(missing) != 1 {
		t.Fatalf("missing %v, want c alone, from 25 s", missing)
	}
}

// refusingHost resets the first refuse pubsub streams it is opened,
// noting each on reset, and serves the rest: a peer at its stream limits
// for a while.
type refusingHost struct {
	host.Host
	refuse atomic.Int32
	reset  chan struct{}
}

func (h *refusingHost) SetStreamHandler(id protocol.ID, handler network.StreamHandler) {
	if !slices.Contains(pubsub.GossipSubDefaultProtocols, id) {
		h.Host.SetStreamHandler(id, handler)
		return
	}
	h.Host.SetStreamHandler(id, func(s network.Stream) {
		if h.refuse.Add(-1) >= 0 {
			s.Reset()
			h.reset <- struct{}{}
			return
		}
		handler(s)
	})
}

// TestPeerMissingFromTheTopicIsRelinked: a peer whose pubsub streams
// failed while connected (here: reset until this node's pubsub gave the
// peer up; in a join storm, a seed's limits) is missing from the state
// topic for as long as the connection lasts: pubsub does not try it again.
// It is relinked, and then both list each other in the topic.
func TestPeerMissingFromTheTopicIsRelinked(t *testing.T) {
	ac := loopbackConfig(t, "a")
	ac.ProbeInterval = 100 * time.Millisecond
	a := startNode(t, ac)

	key, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := libp2p.New(libp2p.Identity(key), libp2p.NoListenAddrs)
	if err != nil {
		t.Fatal(err)
	}
	// a's pubsub opens a stream, and tries again 4 times, then gives b up.
	rh := &refusingHost{Host: h, reset: make(chan struct{}, 16)}
	rh.refuse.Store(5)
	bc := loopbackConfig(t, "b")
	bc.Join = []string{tcpAddr(a)}
	b := startNodeDeps(t, bc, Deps{Host: rh})
	for i := range 5 {
		select {
		case <-rh.reset:
		case <-time.After(30 * time.Second):
			t.Fatalf("a's pubsub opened %d streams to b, want 5", i)
		}
	}
	inTopic := func(n *Node, p peer.ID) bool { return slices.Contains(n.replica.TopicPeers(), p) }
	waitFor(t, "a and b in each other's state topic", func() bool { return inTopic(a, b.ID()) && inTopic(b, a.ID()) })
	if a.relinks.Load() == 0 {
		t.Fatal("a lists b in its topic without a relink: the test did not break a's pubsub link")
	}
}
