package node

import (
	"context"
	"encoding/base32"
	"strings"
	"sync/atomic"

	ds "github.com/ipfs/go-datastore"
	dssync "github.com/ipfs/go-datastore/sync"
	mh "github.com/multiformats/go-multihash"
)

// rendezvousStore is the DHT's provider datastore: it keeps provider
// records of this cluster's rendezvous key only. Any peer may send an
// ADD_PROVIDER for any key of up to 80 bytes, kept two days: records of
// made-up keys, bounded by nothing but its bandwidth. A record of another
// key is dropped as it is written and counted (dht_provider_refused);
// the write reports no error, as the DHT writes records in batches and
// one failing write would fail the rest.
type rendezvousStore struct {
	ds.Batching
	prefix  string // the datastore key prefix of the rendezvous key's records
	refused atomic.Int64
}

// newRendezvousStore is an in-memory provider datastore (the DHT's
// default) keeping the records of rendezvous key ns alone.
func newRendezvousStore(ns string) *rendezvousStore {
	h, _ := mh.Sum([]byte(ns), mh.SHA2_256, -1) // as routing discovery keys ns
	return &rendezvousStore{
		Batching: dssync.MutexWrap(ds.NewMapDatastore()),
		// As the DHT's provider manager names a record:
		// /providers/<key>/<peer>, each in unpadded base32.
		prefix: "/providers/" + base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h) + "/",
	}
}

func (s *rendezvousStore) keep(k ds.Key) bool {
	if strings.HasPrefix(k.String(), s.prefix) {
		return true
	}
	s.refused.Add(1)
	return false
}

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
