package gossip

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
)

// The cache of accepted peer IDs stays within its bound, and answers as
// decoding does before and after it is emptied.
func TestPeerIDCacheIsBounded(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	first := newAuthor(t, rng).id
	if got, ok := canonicalPeer(first.String()); !ok || got != first {
		t.Fatalf("canonicalPeer(%s) = %v, %v", first, got, ok)
	}
	for range peerIDsMax + 10 {
		id := peer.ID(fmt.Sprint(rng.Uint64())) // any bytes: only the cache is under test
		peerIDs.put(id.String(), id)
	}
	peerIDs.mu.Lock()
	held := len(peerIDs.m)
	peerIDs.mu.Unlock()
	if held > peerIDsMax {
		t.Fatalf("the cache holds %d IDs, more than %d", held, peerIDsMax)
	}
	if got, ok := canonicalPeer(first.String()); !ok || got != first {
		t.Fatalf("after the cache was emptied: canonicalPeer(%s) = %v, %v", first, got, ok)
	}
	if _, ok := canonicalPeer(first.String() + "x"); ok {
		t.Fatal("a string that does not decode was accepted")
	}
}
