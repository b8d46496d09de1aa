package node

import (
	"context"
	"encoding/base32"
	"strings"
	"sync/atomic"

	ds "github.com/ipfs/go-datastore"
	dssync "github.com/ipfs/go-datastore/sync"
	"github.com/libp2p/go-libp2p/core/peer"
	mh "github.com/multiformats/go-multihash"
)

// rendezvousStore is the DHT's provider datastore: it keeps provider
// records of this cluster's rendezvous key only, and of nodes that count
// only. Any peer may send an ADD_PROVIDER for any key of up to 80 bytes,
// one per identity it makes, kept two days: records of made-up keys, or
// of made-up identities under the rendezvous key, bounded by nothing but
// its bandwidth (agents dial only nodes that count from the rendezvous,
// so those records served no one). A record of another key or of a node
// that does not count is dropped as it is written and counted
// (dht_provider_refused); the write reports no error, as the DHT writes
// records in batches and one failing write would fail the rest.
type rendezvousStore struct {
	ds.Batching
	prefix  string             // the datastore key prefix of the rendezvous key's records
	counts  func(peer.ID) bool // whether a provider counts (the trust rules)
	refused atomic.Int64
}

// newRendezvousStore is an in-memory provider datastore (the DHT's
// default) keeping the records of rendezvous key ns alone, of providers
// that count.
func newRendezvousStore(ns string, counts func(peer.ID) bool) *rendezvousStore {
	h, _ := mh.Sum([]byte(ns), mh.SHA2_256, -1) // as routing discovery keys ns
	return &rendezvousStore{
		Batching: dssync.MutexWrap(ds.NewMapDatastore()),
		// As the DHT's provider manager names a record:
		// /providers/<key>/<peer>, each in unpadded base32.
		prefix: "/providers/" + base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h) + "/",
		counts: counts,
	}
}

func (s *rendezvousStore) keep(k ds.Key) bool {
	if rest, ok := strings.CutPrefix(k.String(), s.prefix); ok {
		b, err := base32.StdEncoding.WithPadding(base32.NoPadding).DecodeString(rest)
		if err == nil {
			if p, err := peer.IDFromBytes(b); err == nil && s.counts(p) {
				return true
			}
		}
	}
	s.refused.Add(1)
	return false
}

// noProviderCache is the provider manager's cache of provider sets by
// key: none. The manager adds every record it is given to the cached set
// of its key, past the datastore (which refuses most), and the
// rendezvous key, looked up, stays cached: each lookup reads the
// datastore instead, which holds a record per node that counts at most.
type noProviderCache struct{}

func (noProviderCache) Add(key, value any) bool        { return false }
func (noProviderCache) Get(key any) (any, bool)        { return nil, false }
func (noProviderCache) Contains(key any) bool          { return false }
func (noProviderCache) Peek(key any) (any, bool)       { return nil, false }
func (noProviderCache) Remove(key any) bool            { return false }
func (noProviderCache) RemoveOldest() (any, any, bool) { return nil, nil, false }
func (noProviderCache) GetOldest() (any, any, bool)    { return nil, nil, false }
func (noProviderCache) Keys() []any                    { return nil }
func (noProviderCache) Len() int                       { return 0 }
func (noProviderCache) Purge()                         {}
func (noProviderCache) Resize(int) int                 { return 0 }

func (s *rendezvousStore) Put(ctx context.Context, k ds.Key, v []byte) error {
	if !s.keep(k) {
		return nil
	}
	return s.Batching.Put(ctx, k, v)
}

func (s *rendezvousStore) Batch(ctx context.Context) (ds.Batch, error) {
	b, err := s.Batching.Batch(ctx)
	if err != nil {
		return nil, err
	}
	return rendezvousBatch{b, s}, nil
}

type rendezvousBatch struct {
	ds.Batch
	s *rendezvousStore
}

func (b rendezvousBatch) Put(ctx context.Context, k ds.Key, v []byte) error {
	if !b.s.keep(k) {
		return nil
	}
	return b.Batch.Put(ctx, k, v)
}
