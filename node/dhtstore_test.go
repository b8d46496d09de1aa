package node

import (
	"context"
	"testing"

	"github.com/ipfs/go-cid"
	dsq "github.com/ipfs/go-datastore/query"
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
