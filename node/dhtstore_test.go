package node

import (
	"context"
	"testing"

	"github.com/ipfs/go-cid"
	dsq "github.com/ipfs/go-datastore/query"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	mh "github.com/multiformats/go-multihash"
)

// The DHT keeps provider records of this cluster's rendezvous key only:
// records of any other key (which any peer may send) are dropped and
// counted, through the DHT's own provider manager.
func TestDHTKeepsOnlyTheRendezvousProviders(t *testing.T) {
	n := startNode(t, loopbackConfig(t, "a"))
	kad, err := n.newDHT()
	if err != nil {
		t.Fatal(err)
	}
	key := func(s string) cid.Cid {
		h, _ := mh.Sum([]byte(s), mh.SHA2_256, -1)
		return cid.NewCidV1(cid.Raw, h)
	}
	ctx := context.Background()
	for _, ns := range []string{rendezvous(n.cfg.Cluster), "made-up", rendezvous("another-cluster")} {
		if err := kad.Provide(ctx, key(ns), false); err != nil {
			t.Fatal(err)
		}
	}
	kad.Close() // the provider manager writes what it buffered
	res, err := n.providers.Query(ctx, dsq.Query{Prefix: "/providers/", KeysOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	all, _ := res.Rest()
	if len(all) != 1 || n.providers.refused.Load() != 2 {
		t.Fatalf("%d provider records kept, %d refused: want the rendezvous key's one, and 2", len(all), n.providers.refused.Load())
	}
}

// Provider records of the rendezvous key are kept only of nodes that
// count: anyone may send one per identity it makes, identities cost
// nothing, and each was kept two days, in the datastore and in the
// provider manager's cache of the key (which took every record, whatever
// the datastore kept). Agents dial only nodes that count from the
// rendezvous, so the others' records served no one.
func TestDHTKeepsRendezvousProvidersOnlyOfNodesThatCount(t *testing.T) {
	c := loopbackConfig(t, "a")
	writer := newPeerID(t)
	c.Trusted = []string{writer.String()}
	n := startNode(t, c)
	kad, err := n.newDHT()
	if err != nil {
		t.Fatal(err)
	}
	h, _ := mh.Sum([]byte(rendezvous(n.cfg.Cluster)), mh.SHA2_256, -1)
	ctx := context.Background()
	store := kad.ProviderStore()
	addr := peer.AddrInfo{Addrs: []ma.Multiaddr{ma.StringCast("/ip4/10.0.0.1/tcp/4001")}}
	add := func(p peer.ID) {
		ai := addr
		ai.ID = p
		if err := store.AddProvider(ctx, h, ai); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string) {
		t.Helper()
		got, err := store.GetProviders(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].ID != writer {
			t.Fatalf("%s: %d providers of the rendezvous key, want the trusted writer alone", when, len(got))
		}
	}
	// The provider manager writes its records out 256 at a time; the
	// last write of each batch of 256 below flushes it.
	add(writer)
	for range 255 {
		add(newPeerID(t))
	}
	check("strangers' records written out")
	for range 256 {
		add(newPeerID(t)) // the key is in the manager's cache now
	}
	check("strangers' records added with the key cached")
	if got := n.providers.refused.Load(); got != 511 {
		t.Fatalf("%d records refused, want 511", got)
	}
}
