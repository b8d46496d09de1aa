package gossip

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
)

// A Shared pull brings everything but the direct entries, however many
// the source holds; a Full pull brings those too. Two nodes that hold
// different direct entries agree in Shared: a pull between them costs one
// round.
func TestScopedPulls(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	a := newAuthor(t, rng)
	b := newAuthor(t, rng)
	src, dst := NewState(NewTrust()), NewState(NewTrust())
	src.SetDirect(DirectKey)
	dst.SetDirect(DirectKey)
	apply := func(s *State, e *Signed) {
		t.Helper()
		if _, err := s.Apply(e, t0); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 40 {
		apply(src, a.write(t, t0, fmt.Sprintf("jobs/j%d/acks/%s", i, a.id), "ack", false))
	}
	shared := []string{"nodes/" + a.id.String(), "tribes/web/members/" + a.id.String() + "/policy", "jobs/ja"}
	for _, k := range shared {
		apply(src, a.write(t, t0, k, "v", false))
	}
	own := "jobs/jz/acks/" + b.id.String()
	apply(dst, b.write(t, t0, own, "mine", false))
	pullScoped(t, dst, src, t0, Shared)
	var got []string
	for k := range dst.entries {
		got = append(got, k)
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(append(shared, own)))
	if !slices.Equal(got, want) {
		t.Fatalf("after a Shared pull dst holds %v, want %v", got, want)
	}
	sharedRoot := func(s *State) uint64 { return s.StartPull(Shared).Probes[0].Hash }
	if sharedRoot(dst) != sharedRoot(src) || dst.Root() == src.Root() {
		t.Fatal("Shared roots should agree and Full roots differ")
	}
	req := dst.StartPull(Shared)
	if resp := src.Respond(req, 1<<20, Shared); len(resp.Nodes) != 0 {
		t.Fatalf("a Shared pull between states that differ only in direct entries answered %d nodes, want none", len(resp.Nodes))
	}
	pullScoped(t, dst, src, t0, Full)
	if dst.Len() != src.Len()+1 { // src's, and dst's own ack
		t.Fatalf("after a Full pull dst holds %d keys, want %d", dst.Len(), src.Len()+1)
	}
	if _, ok := dst.Get("jobs/j7/acks/" + a.id.String()); !ok {
		t.Fatal("a Full pull did not bring a direct entry")
	}
}

// A node asked about a key by hash serves it in either scope.
func TestWantsAreServedInEitherScope(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	a := newAuthor(t, rng)
	s := NewState(NewTrust())
	s.SetDirect(DirectKey)
	key := "jobs/j/acks/" + a.id.String()
	if _, err := s.Apply(a.write(t, t0, key, "ack", false), t0); err != nil {
		t.Fatal(err)
	}
	for _, sc := range []Scope{Full, Shared} {
		resp := s.Respond(SyncRequest{Want: []uint64{keyHash(key)}}, 1<<20, sc)
		if resp.Served != 1 || len(resp.Entries) != 1 {
			t.Fatalf("%v: served %d, %d entries, want the ack", sc, resp.Served, len(resp.Entries))
		}
	}
}

func TestScopeWith(t *testing.T) {
	n := newTestNet(t)
	other := peer.ID("other")
	for _, tc := range []struct {
		name    string
		direct  bool
		trusted []peer.ID
		want    Scope
	}{
		{"no direct keys", false, []peer.ID{other}, Full},
		{"no trust list: every node may write a job", true, nil, Full},
		{"both trusted writers", true, []peer.ID{n.r.self, other}, Full},
		{"this node a writer, the peer not", true, []peer.ID{n.r.self}, Shared},
		{"the peer a writer, this node not", true, []peer.ID{other}, Shared},
	} {
		n.r.cfg.Direct = nil
		if tc.direct {
			n.r.cfg.Direct = DirectKey
		}
		tr := NewTrust(tc.trusted...)
		n.r.trust.Store(&tr)
		if got := n.r.ScopeWith(other); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Forget drops keys from the state and the store, leaving no tombstone,
// and watchers see them go.
func TestForget(t *testing.T) {
	n := newTestNet(t)
	ctx := context.Background()
	ack, rec := "jobs/j/acks/"+n.r.self.String(), "nodes/"+n.r.self.String()
	if _, err := n.r.Put(ctx, ack, []byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := n.r.Put(ctx, rec, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	var seen []Change
	defer n.r.Watch("jobs/", func(c Change) { seen = append(seen, c) })()
	if err := n.r.Forget(ack, "jobs/none"); err != nil {
		t.Fatal(err)
	}
	if _, ok := n.r.Version(ack); ok {
		t.Fatal("a forgotten key is still held (or left a tombstone)")
	}
	if _, ok := n.r.Get(rec); !ok {
		t.Fatal("Forget dropped a key it was not given")
	}
	if len(seen) != 1 || seen[0].Key != ack || seen[0].New != nil {
		t.Fatalf("watchers saw %+v, want the ack gone", seen)
	}
	st := NewState(Trust{})
	if _, _, err := LoadState(n.r.store, st, nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := st.Version(ack); ok {
		t.Fatal("a forgotten key is still stored")
	}
}

func TestDirectKey(t *testing.T) {
	p := newAuthor(t, rand.New(rand.NewPCG(7, 8))).id.String()
	for key, want := range map[string]bool{
		"jobs/j1/acks/" + p:                   true,
		"jobs/j1":                             false,
		"nodes/" + p:                          false,
		"tribes/web/members/" + p + "/policy": false,
		"jobs/j1/acks/not-a-peer":             false,
		"nope":                                false,
	} {
		if got := DirectKey(key); got != want {
			t.Errorf("DirectKey(%q) = %v, want %v", key, got, want)
		}
	}
}

// A trusted writer's pulls from a node that is not one leave that node's
// ack out; the writer asks for it by key and gets it.
func TestFetchKeysBringsADirectEntry(t *testing.T) {
	w, target := directPair(t, true, nil)
	h := target.h
	ctx := context.Background()
	ack := "jobs/j/acks/" + h.ID().String()
	if _, err := target.r.PutQuiet(ctx, ack, []byte(`{"state":"done"}`)); err != nil {
		t.Fatal(err)
	}
	if st, err := w.r.SyncWith(ctx, h.ID()); err != nil || st.Fetched != 0 {
		t.Fatalf("the writer's pull: %+v %v, want nothing fetched", st, err)
	}
	if _, ok := w.r.Get(ack); ok {
		t.Fatal("a Shared pull brought an ack")
	}
	// The two replicas also pull from each other in the background: on a
	// loaded machine those may hold the target's two slots for w's pulls
	// (maxServingPerPeer), and the target refuses a third with a reset.
	var st SyncStats
	var err error
	for range 50 {
		if st, err = w.r.FetchKeys(ctx, h.ID(), ack, "jobs/j/acks/"+w.h.ID().String()); err == nil || !errors.Is(err, network.ErrReset) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || st.Rounds != 1 || st.Applied != 1 {
		t.Fatalf("FetchKeys: %+v %v, want the ack in one round", st, err)
	}
	if _, ok := w.r.Get(ack); !ok {
		t.Fatal("FetchKeys did not bring the ack")
	}
	if st, err := w.r.SyncScoped(ctx, h.ID(), Full); err != nil || st.Fetched != 0 {
		t.Fatalf("a Full pull after it: %+v %v, want nothing left to fetch", st, err)
	}
}

// A node that pulls in scope Shared from a peer of an earlier version
// (which serves only the full protocol) compares everything, as before.
func TestSharedPullFromAnEarlierVersion(t *testing.T) {
	anyone := func(peer.ID) bool { return true } // an earlier version serves anyone
	w, old := directPair(t, false, func(h host.Host) {
		h.RemoveStreamHandler(SyncSharedProtocol) // as an agent of an earlier version
	}, nil, anyone)
	h := old.h
	ack := "jobs/j/acks/" + h.ID().String()
	if _, err := old.r.PutQuiet(context.Background(), ack, []byte(`{"state":"done"}`)); err != nil {
		t.Fatal(err)
	}
	if sc := w.r.ScopeWith(h.ID()); sc != Shared {
		t.Fatalf("scope %v, want shared", sc)
	}
	if _, err := w.r.SyncWith(context.Background(), h.ID()); err != nil {
		t.Fatalf("pull from the earlier version: %v", err)
	}
	if _, ok := w.r.Get(ack); !ok {
		t.Fatal("the pull in the full protocol did not compare the direct entries")
	}
}

// directPair starts two replicas on one mock network with direct keys,
// the first the trusted writer if firstWrites, else the second; change,
// if set, is done to the second's host before they connect; counts, if
// given, are the first's and the second's ReplicaConfig.Counts.
func directPair(t *testing.T, firstWrites bool, change func(host.Host), counts ...func(peer.ID) bool) (first, second *testNet) {
	t.Helper()
	c := &testNet{mn: mocknet.New()}
	if len(counts) == 2 {
		c.counts = counts[0]
	}
	first = startTestNet(t, c)
	second = &testNet{mn: first.mn}
	if len(counts) == 2 {
		second.counts = counts[1]
	}
	h, err := genPeer(first.mn)
	if err != nil {
		t.Fatal(err)
	}
	second.start(t, h)
	if change != nil {
		change(h)
	}
	trust := NewTrust(h.ID())
	if firstWrites {
		trust = NewTrust(first.h.ID())
	}
	for _, n := range []*testNet{first, second} {
		n.r.cfg.Direct = DirectKey
		n.r.state.SetDirect(DirectKey)
		n.r.trust.Store(&trust)
	}
	if _, err := first.mn.LinkPeers(first.h.ID(), h.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := first.mn.ConnectPeers(first.h.ID(), h.ID()); err != nil {
		t.Fatal(err)
	}
	return first, second
}

// A peer that does not count gets no direct entry from a node, whatever it
// asks: a pull in scope Full is answered in Shared, and a want of a direct
// key as one not held (job acks carry the head of a job's output). A peer
// that counts gets it.
func TestDirectEntriesOnlyForPeersThatCount(t *testing.T) {
	var admitted atomic.Bool
	w, other := directPair(t, true, nil, func(peer.ID) bool { return admitted.Load() }, nil) // w the trusted writer; other counts for nothing
	ctx := context.Background()
	ack := "jobs/j/acks/" + w.h.ID().String()
	if _, err := w.r.PutQuiet(ctx, ack, []byte(`{"state":"done","output_head":"secret"}`)); err != nil {
		t.Fatal(err)
	}
	// The two replicas also pull from each other in the background: such
	// a pull may hold a slot, and a refused one is a reset; try again.
	retry := func(f func() (SyncStats, error)) (st SyncStats, err error) {
		for range 50 {
			if st, err = f(); err == nil || !errors.Is(err, network.ErrReset) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		return
	}
	if _, err := retry(func() (SyncStats, error) { return other.r.SyncScoped(ctx, w.h.ID(), Full) }); err != nil {
		t.Fatal(err)
	}
	if _, err := retry(func() (SyncStats, error) { return other.r.FetchKeys(ctx, w.h.ID(), ack) }); err != nil {
		t.Fatal(err)
	}
	if _, ok := other.r.Get(ack); ok {
		t.Fatal("a peer that does not count got a direct entry")
	}
	admitted.Store(true) // other admitted
	if st, err := retry(func() (SyncStats, error) { return other.r.FetchKeys(ctx, w.h.ID(), ack) }); err != nil || st.Applied != 1 {
		t.Fatalf("a peer that counts: %+v %v, want the ack", st, err)
	}
}
