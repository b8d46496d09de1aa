package gossip

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
)

func TestHonestMayRelay(t *testing.T) {
	author, other := peer.ID("author"), peer.ID("other")
	e := &Signed{Entry: Entry{Key: "tribes/x", Author: author}}
	for _, c := range []struct {
		name string
		err  error
		from peer.ID
		want bool
	}{
		{"bytes that do not open", ErrMalformed, other, false},
		{"oversized", ErrTooLarge, author, false},
		{"its own entry, unauthorised", ErrUnauthorized, author, false},
		{"another's entry, unauthorised here", ErrUnauthorized, other, true},
		{"a key kind this version does not know", ErrUnknownKey, author, true},
		{"a clock ahead", ErrFromFuture, author, true},
		// Rejected, it would lower the score of an earlier version's
		// node that took it and passed it on (one message ID).
		{"its own entry, a value refused here", ErrValueRefused, author, true},
		{"another's entry, a value refused here", ErrValueRefused, other, true},
	} {
		if got := honestMayRelay(fmt.Errorf("gossip: %w", c.err), e, c.from); got != c.want {
			t.Errorf("%s: honestMayRelay = %v, want %v", c.name, got, c.want)
		}
	}
}

// A peer that publishes entries the validator rejects loses score with
// each, and past GraylistThreshold pubsub ignores it.
func TestRejectedEntriesCostTheSenderScore(t *testing.T) {
	var mu sync.Mutex
	scores := map[peer.ID]float64{}
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	h, err := genPeer(mn)
	if err != nil {
		t.Fatal(err)
	}
	n := &testNet{mn: mn, psOpts: []pubsub.Option{pubsub.WithPeerScoreInspect(func(m map[peer.ID]float64) {
		mu.Lock()
		defer mu.Unlock()
		scores = m
	}, 100*time.Millisecond)}}
	n.start(t, h)

	rogue, err := genPeer(mn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ps, err := pubsub.NewGossipSub(ctx, rogue, PubSubOptions("")...) // unsigned, as the replica wants
	if err != nil {
		t.Fatal(err)
	}
	topic, err := ps.Join("tribe/test")
	if err != nil {
		t.Fatal(err)
	}
	// Subscribed, the rogue joins the replica's mesh: scoring a mesh peer
	// must work (a zero TimeInMeshQuantum divided by zero there).
	if _, err := topic.Subscribe(); err != nil {
		t.Fatal(err)
	}
	if _, err := mn.LinkPeers(rogue.ID(), h.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := mn.ConnectPeers(rogue.ID(), h.ID()); err != nil {
		t.Fatal(err)
	}
	score := func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return scores[rogue.ID()]
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(topic.ListPeers()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the rogue never saw the replica in the topic")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // a heartbeat or two: the mesh forms and is scored
	sent := 0
	for score() > GraylistThreshold {
		if time.Now().After(deadline) {
			t.Fatalf("after %d rejected entries the rogue's score is %v, not below %v", sent, score(), GraylistThreshold)
		}
		if sent < 20 {
			if err := topic.Publish(ctx, fmt.Appendf(nil, "not an entry %d", sent)); err != nil {
				t.Fatal(err)
			}
			sent++
		}
		time.Sleep(50 * time.Millisecond)
	}
	total := int64(0)
	for _, c := range n.r.Rejected() {
		total += c
	}
	if total < 5 || total > int64(sent) {
		t.Errorf("%d refused entries counted (%v) for %d sent, want 5 to %d", total, n.r.Rejected(), sent, sent)
	}
	t.Logf("score %.0f after %d rejected entries", score(), sent)
}

// The counters decay every scoreDecayInterval (not pubsub's second: a
// timer that woke idle agents), at a rate that still takes a rejected
// entry's count to a hundredth in invalidEntryDecay.
func TestScoreDecaysRarelyAtTheSameRate(t *testing.T) {
	params, _ := scoreParams("tribe/test")
	if params.DecayInterval != scoreDecayInterval || scoreDecayInterval < 10*time.Second {
		t.Fatalf("decay every %v, want every %v (at least 10 s)", params.DecayInterval, scoreDecayInterval)
	}
	f := params.Topics["tribe/test"].InvalidMessageDeliveriesDecay
	ticks := float64(invalidEntryDecay / params.DecayInterval)
	if left := math.Pow(f, ticks); math.Abs(left-decayToZero) > 1e-9 {
		t.Fatalf("after %v a count is %.4f of itself, want %v", invalidEntryDecay, left, decayToZero)
	}
}
