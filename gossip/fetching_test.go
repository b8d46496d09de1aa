package gossip

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

func TestFetchingClaims(t *testing.T) {
	var f fetching
	a, b := ItemSummary{KeyHash: 1, VersionHash: 10}, ItemSummary{KeyHash: 1, VersionHash: 11}
	steps := []struct {
		name string
		do   func() bool
		want bool
	}{
		{"pull 1 claims a", func() bool { return f.claim(1, a, t0) }, true},
		{"pull 2 may not claim a", func() bool { return f.claim(2, a, t0.Add(fetchStale-time.Millisecond)) }, false},
		{"pull 1 claims a again", func() bool { return f.claim(1, a, t0.Add(time.Second)) }, true},
		{"pull 2 claims another version of a's key", func() bool { return f.claim(2, b, t0) }, true},
		{"pull 2 takes a over once pull 1's claim is stale", func() bool { return f.claim(2, a, t0.Add(time.Second+fetchStale)) }, true},
		{"pull 1's release leaves pull 2's claim", func() bool { f.release(1, a); return f.claim(3, a, t0.Add(time.Second+fetchStale)) }, false},
		{"pull 2's release ends it", func() bool { f.release(2, a, b); return f.claim(3, a, t0) }, true},
	}
	for _, s := range steps {
		if got := s.do(); got != s.want {
			t.Fatalf("%s: %v, want %v", s.name, got, s.want)
		}
	}
	f.release(3, a)
	if len(f.by) != 0 {
		t.Fatalf("claims left: %v", f.by)
	}
}

func TestNextPullLeavesOutWhatClaimRefuses(t *testing.T) {
	s := NewState(Trust{})
	items := fakeItems(5)
	req := s.StartPull(Full)
	resp := SyncResponse{Nodes: []NodeReply{{Items: items}}}
	next, done := s.NextPull(req, resp, Full, func(it ItemSummary) bool { return it != items[2] })
	want := []uint64{items[0].KeyHash, items[1].KeyHash, items[3].KeyHash, items[4].KeyHash}
	if done || !slices.Equal(next.Want, want) {
		t.Fatalf("wants %x (done %v), want %x", next.Want, done, want)
	}
}

// Two pulls at once from peers that hold the same entries: the second
// leaves to the first what the first asked for and did not get yet, so
// each entry is fetched and checked once; the first then brings them all,
// and the second returns only then (it brought what its peer holds).
func TestConcurrentPullsFetchAnEntryOnce(t *testing.T) {
	n := newTestNet(t)
	const k = 5
	var raws [][]byte
	var items []ItemSummary
	for range k {
		priv, _, err := crypto.GenerateEd25519Key(nil)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := peer.IDFromPrivateKey(priv)
		e, err := Sign(Entry{Key: "nodes/" + id.String(), Value: []byte(`{"name":"x"}`), HLC: MakeHLC(t0.UnixMilli(), 0)}, priv)
		if err != nil {
			t.Fatal(err)
		}
		raws = append(raws, e.Raw)
		items = append(items, ItemSummary{KeyHash: keyHash(e.Key), VersionHash: versionHash(e)})
	}
	slices.SortFunc(items, func(a, b ItemSummary) int { return cmpUint64(a.KeyHash, b.KeyHash) })
	asked, release := make(chan []uint64, 1), make(chan struct{})
	serve := func(rg *rogue, hold bool) {
		rg.serve(func(s network.Stream, round int, req SyncRequest) bool {
			if round == 1 {
				return respond(s, SyncResponse{Nodes: []NodeReply{{Items: items}}})
			}
			if hold {
				asked <- req.Want
				<-release
			}
			return respond(s, SyncResponse{Served: len(req.Want), Entries: raws[:len(req.Want)]})
		})
	}
	slow, fast := newRogue(t, n), newRogue(t, n)
	serve(slow, true)
	serve(fast, false)
	first := make(chan SyncStats, 1)
	go func() {
		st, err := n.r.SyncWith(context.Background(), slow.ID())
		if err != nil {
			t.Error(err)
		}
		first <- st
	}()
	if got := <-asked; len(got) != k {
		t.Fatalf("the first pull asked for %d entries, want %d", len(got), k)
	}
	second := make(chan SyncStats, 1)
	go func() {
		st, err := n.r.SyncWith(context.Background(), fast.ID())
		if err != nil {
			t.Error(err)
		}
		second <- st
	}()
	for deadline := time.Now().Add(time.Minute); n.r.sharedWaits.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) { // the second should wait for the first
			t.Fatal("the second pull never waited for the first")
		}
	}
	select {
	case st := <-second:
		t.Fatalf("the second pull returned before the first brought the entries: %+v", st)
	default:
	}
	close(release)
	if st := <-first; st.Fetched != k || st.Applied != k {
		t.Fatalf("first pull: %+v, want %d fetched and applied", st, k)
	}
	if st := <-second; st.Fetched != 0 || st.Shared != k {
		t.Fatalf("second pull: %+v, want nothing fetched and %d left to the first", st, k)
	}
	if tot := n.r.SyncTotals(); tot.Fetched != k || tot.Shared != k {
		t.Fatalf("totals %+v, want %d fetched and %d shared", tot, k, k)
	}
	n.r.mu.Lock()
	left := len(n.r.fetching.by)
	n.r.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d claims left after both pulls ended", left)
	}
	// Nothing is missing any more: a third pull wants nothing.
	if st, err := n.r.SyncWith(context.Background(), fast.ID()); err != nil || st.Fetched != 0 || st.Shared != 0 {
		t.Fatalf("third pull: %+v %v, want nothing to fetch", st, err)
	}
}
