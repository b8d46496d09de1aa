package gossip

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	pb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
)

// SetTrust loads the state again under the new list: entries of writers no
// longer trusted stop counting (watchers see them go), stored entries come
// back when their writer is trusted again, and arriving entries are checked
// against the new list.
func TestSetTrustReloadsTheStateUnderTheNewList(t *testing.T) {
	n := newTestNet(t)
	r := n.r
	writer := func() (crypto.PrivKey, peer.ID) {
		k, _, err := crypto.GenerateEd25519Key(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := peer.IDFromPrivateKey(k)
		return k, id
	}
	ka, a := writer()
	kb, _ := writer()
	hlc := MakeHLC(n.clock.now().UnixMilli(), 0)
	for key, k := range map[string]crypto.PrivKey{"tribes/x": ka, "tribes/y": kb} {
		s, err := Sign(Entry{Key: key, Value: []byte("v"), HLC: hlc}, k)
		if err != nil {
			t.Fatal(err)
		}
		if r.applyRemote([]*Signed{s}) != 1 {
			t.Fatalf("%s not applied under open trust", key)
		}
	}
	var mu sync.Mutex
	var seen []string
	cancel := r.Watch("tribes/", func(c Change) {
		mu.Lock()
		defer mu.Unlock()
		state := "changed"
		if c.New == nil {
			state = "gone"
		} else if c.Old == nil {
			state = "back"
		}
		seen = append(seen, c.Key+" "+state)
	})
	defer cancel()

	changed, err := r.SetTrust(NewTrust(a))
	if err != nil || changed != 1 {
		t.Fatalf("SetTrust(a): %d changed, %v", changed, err)
	}
	if _, ok := r.Get("tribes/y"); ok {
		t.Error("b's entry still counts once only a is trusted")
	}
	if _, ok := r.Get("tribes/x"); !ok {
		t.Error("a's entry is gone")
	}
	if !r.Trust().Trusted(a) || r.Trust().Open() {
		t.Errorf("trust list in force: %v", r.Trust().Peers())
	}
	late, _ := Sign(Entry{Key: "tribes/z", Value: []byte("v"), HLC: hlc}, kb)
	if err := r.check(late, n.clock.now()); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("b's new entry under the new list: %v", err)
	}
	if _, err := r.Put(t.Context(), "tribes/own", []byte("v")); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("this node, no longer trusted, writes a tribe: %v", err)
	}

	if changed, err := r.SetTrust(NewTrust()); err != nil || changed != 1 {
		t.Fatalf("SetTrust(open): %d changed, %v", changed, err)
	}
	if _, ok := r.Get("tribes/y"); !ok {
		t.Error("b's stored entry did not come back under open trust")
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"tribes/y gone", "tribes/y back"}; !slices.Equal(seen, want) {
		t.Errorf("watchers saw %v, want %v", seen, want)
	}
}

// SetTrust loads the state from the store, so it first stores the entries
// applied before they were stored (a peer's broadcast entry, this node's
// PutBehind write): a reload within a second of gossip dropped them from
// memory, and the flush then had nothing to store.
func TestSetTrustKeepsEntriesAppliedBehind(t *testing.T) {
	n := newTestNet(t)
	r := n.r
	a := newAuthor(t, mrand.New(mrand.NewPCG(9, 9)))
	gossiped := a.write(t, n.clock.now(), "tribes/gossiped", "v", false)
	r.applyGossiped([]*Signed{gossiped})
	own, err := r.PutBehind(context.Background(), "tribes/own", []byte("v"), func(*Signed) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.SetTrust(NewTrust()); err != nil { // the same open list: a reload
		t.Fatal(err)
	}
	st := NewState(NewTrust())
	if _, _, err := LoadState(r.store, st, nil); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{gossiped.Key, own.Key} {
		_, held := r.Get(k)
		_, stored := st.Get(k)
		if !held || !stored {
			t.Errorf("%s: held %v, stored %v after SetTrust", k, held, stored)
		}
	}
}

// trustedNet starts a replica whose trust list is writer alone, and
// whose nodes that count are writer and admitted.
func trustedNet(t testing.TB, writer, admitted *author) *testNet {
	t.Helper()
	return startTestNet(t, &testNet{mn: mocknet.New(), trust: []peer.ID{writer.id},
		counts: func(p peer.ID) bool { return p == writer.id || p == admitted.id }})
}

// With trusted writers set, a node that does not count (ReplicaConfig.
// Counts) may hold its record in the state and nothing else: its
// memberships and acks are refused and counted not_admitted; a node that
// counts, and anyone in an open cluster, writes what the table allows.
func TestEntriesOfNodesThatDoNotCount(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(3, 4))
	writer, pending, admitted := newAuthor(t, rng), newAuthor(t, rng), newAuthor(t, rng)
	n := trustedNet(t, writer, admitted)
	r := n.r
	now := n.clock.now()
	for _, c := range []struct {
		a   *author
		key string
		ok  bool
	}{
		{pending, "nodes/" + pending.id.String(), true},
		{pending, "tribes/web/members/" + pending.id.String() + "/policy", false},
		{pending, "jobs/j1/acks/" + pending.id.String(), false},
		{admitted, "tribes/web/members/" + admitted.id.String() + "/policy", true},
		{admitted, "jobs/j1/acks/" + admitted.id.String(), true},
		{writer, "tribes/web", true},
	} {
		err := r.check(c.a.write(t, now, c.key, "{}", false), now)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrNotAdmitted)) {
			t.Errorf("%s: %v, want allowed %v", c.key, err, c.ok)
		}
	}
	e := pending.write(t, now, "tribes/web/members/"+pending.id.String()+"/policy", "{}", false)
	if _, err := r.Accept(pending.id, e.Raw); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("a pending node's pushed membership: %v", err)
	}
	if got := r.Rejected()["not_admitted"]; got != 1 {
		t.Fatalf("not_admitted %d, want 1", got)
	}
	if _, held := r.Get(e.Key); held {
		t.Fatal("the refused membership is held")
	}
	if _, err := r.SetTrust(NewTrust()); err != nil { // open: everyone writes
		t.Fatal(err)
	}
	if err := r.check(e, now); err != nil {
		t.Fatalf("open cluster: %v", err)
	}
}

// Records of nodes that do not count are bounded: at most
// MaxPendingRecord bytes each and MaxPending held, refused past that as
// ErrNotAdmitted is (counted apart), while a held record may still be
// replaced and a node that counts writes as before.
func TestRecordsOfNodesThatDoNotCountAreBounded(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(5, 6))
	writer, admitted := newAuthor(t, rng), newAuthor(t, rng)
	n := trustedNet(t, writer, admitted)
	r := n.r
	now := n.clock.now()
	big := strings.Repeat("x", MaxPendingRecord)
	stranger := newAuthor(t, rng)
	if _, err := r.Accept(stranger.id, stranger.write(t, now, "nodes/"+stranger.id.String(), `{"name":"`+big+`"}`, false).Raw); !errors.Is(err, ErrPendingTooLarge) || !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("a stranger's record over the bound: %v", err)
	}
	if _, err := r.Accept(admitted.id, admitted.write(t, now, "nodes/"+admitted.id.String(), `{"name":"`+big+`"}`, false).Raw); err != nil {
		t.Fatalf("an admitted node's large record: %v", err)
	}
	var first *author
	for i := range MaxPending {
		a := newAuthor(t, rng)
		if i == 0 {
			first = a
		}
		if _, err := r.Accept(a.id, a.write(t, now, "nodes/"+a.id.String(), `{"name":"p"}`, false).Raw); err != nil {
			t.Fatalf("record %d of a pending node: %v", i, err)
		}
	}
	late := newAuthor(t, rng)
	if _, err := r.Accept(late.id, late.write(t, now, "nodes/"+late.id.String(), `{"name":"p"}`, false).Raw); !errors.Is(err, ErrPendingFull) {
		t.Fatalf("record %d of a pending node: %v, want ErrPendingFull", MaxPending+1, err)
	}
	if _, err := r.Accept(first.id, first.write(t, now, "nodes/"+first.id.String(), `{"name":"q"}`, false).Raw); !errors.Is(err, ErrPendingTooSoon) {
		t.Fatalf("a held pending record's new version at once: %v, want ErrPendingTooSoon", err)
	}
	n.clock.advance(PendingRewrite)
	now = n.clock.now()
	if _, err := r.Accept(first.id, first.write(t, now, "nodes/"+first.id.String(), `{"name":"q"}`, false).Raw); err != nil {
		t.Fatalf("a held pending record's new version %v later: %v", PendingRewrite, err)
	}
	if got := r.Rejected(); got["pending_too_large"] != 1 || got["pending_full"] != 1 || got["pending_too_soon"] != 1 || got["not_admitted"] != 0 {
		t.Fatalf("counted %v", got)
	}
	// Tombstones are no way around the bound: one over a record held is
	// taken (and still counts), one over nothing is refused.
	n.clock.advance(PendingRewrite)
	now = n.clock.now()
	if _, err := r.Accept(first.id, first.write(t, now, "nodes/"+first.id.String(), "", true).Raw); err != nil {
		t.Fatalf("a pending node deleting its record: %v", err)
	}
	r.pending.mu.Lock()
	r.pending.at = time.Time{}
	r.pending.mu.Unlock()
	if _, err := r.Accept(late.id, late.write(t, now, "nodes/"+late.id.String(), `{"name":"p"}`, false).Raw); !errors.Is(err, ErrPendingFull) {
		t.Fatalf("a record once one held was deleted: %v, want ErrPendingFull", err)
	}
	n.clock.advance(PendingRewrite)
	now = n.clock.now()
	if _, err := r.Accept(first.id, first.write(t, now, "nodes/"+first.id.String(), `{"name":"back"}`, false).Raw); err != nil {
		t.Fatalf("a record over its own tombstone: %v", err)
	}
	ghost := newAuthor(t, rng)
	if _, err := r.Accept(ghost.id, ghost.write(t, now, "nodes/"+ghost.id.String(), "", true).Raw); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("a tombstone over nothing: %v", err)
	}
	// Revoking one makes room for one more, at the next count.
	r.cfg.Revoked = func(p peer.ID) bool { return p == first.id }
	r.pending.mu.Lock()
	r.pending.at = time.Time{}
	r.pending.mu.Unlock()
	if _, err := r.Accept(late.id, late.write(t, now, "nodes/"+late.id.String(), `{"name":"p"}`, false).Raw); err != nil {
		t.Fatalf("a record once one of the held was revoked: %v", err)
	}
}

// A node that counts may name any tribe in a policy membership of its
// own, but others hold at most MaxPolicyMemberships such keys of it,
// tombstones included: past that a new one is refused (author_full, not
// scored), a held one may still change, and its own node refuses to
// write one more. Another author's are counted apart.
func TestPolicyMembershipsPerAuthorAreBounded(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(7, 8))
	writer, admitted, other := newAuthor(t, rng), newAuthor(t, rng), newAuthor(t, rng)
	n := startTestNet(t, &testNet{mn: mocknet.New(), trust: []peer.ID{writer.id},
		counts: func(peer.ID) bool { return true }})
	r := n.r
	now := n.clock.now()
	key := func(a *author, i int) string {
		return fmt.Sprintf("tribes/t%d/members/%s/policy", i, a.id)
	}
	for i := range MaxPolicyMemberships {
		deleted := i%2 == 1 // tombstones count as keys held
		e := admitted.write(t, now, key(admitted, i), `{"policies":["p"]}`, deleted)
		if _, err := r.Accept(admitted.id, e.Raw); err != nil {
			t.Fatalf("membership %d: %v", i, err)
		}
		if err := r.Apply(e); err != nil {
			t.Fatal(err)
		}
	}
	late := admitted.write(t, now, key(admitted, MaxPolicyMemberships), `{"policies":["p"]}`, false)
	if _, err := r.Accept(admitted.id, late.Raw); !errors.Is(err, ErrAuthorFull) {
		t.Fatalf("membership %d: %v, want ErrAuthorFull", MaxPolicyMemberships+1, err)
	}
	if got := r.Rejected()["author_full"]; got != 1 {
		t.Fatalf("author_full %d, want 1", got)
	}
	if !disagreement(fmt.Errorf("x: %w", ErrAuthorFull)) {
		t.Fatal("an author over the bound is not a disagreement: a peer holding other keys of it would be penalised")
	}
	again := admitted.write(t, now, key(admitted, 0), `{"policies":["q"]}`, false)
	if _, err := r.Accept(admitted.id, again.Raw); err != nil {
		t.Fatalf("a new version of a held membership: %v", err)
	}
	if _, err := r.Accept(other.id, other.write(t, now, key(other, 0), `{"policies":["p"]}`, false).Raw); err != nil {
		t.Fatalf("another author's membership: %v", err)
	}
	// Forgetting one (as collecting its tombstone does) makes room.
	if err := r.Forget(key(admitted, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Accept(admitted.id, late.Raw); err != nil {
		t.Fatalf("after a key was forgotten: %v", err)
	}
}

// The topic validator refuses what an entry says before it checks its
// signature: a membership of a node that does not count, and a record of
// a new node past MaxPending, are refused (ignored, not scored) whatever
// their signatures, counted as what they say; an entry it would take is
// still refused for a bad signature, and rejected. A record refused
// before its signature took no pending slot.
func TestValidatorRefusesWhatEntriesSayBeforeTheirSignatures(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(9, 10))
	writer, admitted, stranger := newAuthor(t, rng), newAuthor(t, rng), newAuthor(t, rng)
	n := trustedNet(t, writer, admitted)
	r := n.r
	now := n.clock.now()
	validate := func(e *Signed) pubsub.ValidationResult {
		return r.validate(context.Background(), stranger.id, &pubsub.Message{Message: &pb.Message{Data: e.Raw}})
	}
	forged := func(e *Signed) *Signed {
		raw := slices.Clone(e.Raw)
		raw[len(raw)-1] ^= 1 // the signature is the envelope's last field
		return &Signed{Entry: e.Entry, Raw: raw}
	}
	member := forged(stranger.write(t, now, "tribes/web/members/"+stranger.id.String()+"/policy", `{}`, false))
	if got := validate(member); got != pubsub.ValidationIgnore {
		t.Fatalf("a forged membership of a node that does not count: %v, want ignored", got)
	}
	if got := r.Rejected(); got["not_admitted"] != 1 || got["bad_signature"] != 0 {
		t.Fatalf("counted %v, want not_admitted before the signature", got)
	}
	ok := forged(admitted.write(t, now, "tribes/web/members/"+admitted.id.String()+"/policy", `{}`, false))
	if got := validate(ok); got != pubsub.ValidationReject {
		t.Fatalf("a forged membership of a node that counts: %v, want rejected", got)
	}
	if got := r.Rejected()["bad_signature"]; got != 1 {
		t.Fatalf("bad_signature %d, want 1", got)
	}
	// Forged records take no pending slot: MaxPending of them leave
	// room for a real one.
	for range MaxPending {
		a := newAuthor(t, rng)
		if got := validate(forged(a.write(t, now, "nodes/"+a.id.String(), `{"name":"p"}`, false))); got != pubsub.ValidationReject {
			t.Fatalf("a forged record: %v, want rejected", got)
		}
	}
	real := newAuthor(t, rng)
	if got := validate(real.write(t, now, "nodes/"+real.id.String(), `{"name":"p"}`, false)); got != pubsub.ValidationAccept {
		t.Fatalf("a record after %d forged ones: %v, want accepted", MaxPending, got)
	}
	// Past MaxPending, a new record is refused before its signature.
	r.pending.mu.Lock()
	r.pending.n, r.pending.at = MaxPending, n.clock.now()
	r.pending.mu.Unlock()
	late := newAuthor(t, rng)
	if got := validate(forged(late.write(t, now, "nodes/"+late.id.String(), `{"name":"p"}`, false))); got != pubsub.ValidationIgnore {
		t.Fatalf("a forged record past MaxPending: %v, want ignored", got)
	}
	if got := r.Rejected()["pending_full"]; got != 1 {
		t.Fatalf("pending_full %d, want 1", got)
	}
}

// check, on the push and pull paths, refuses a bad value as such before
// it looks at its author's bounds: a pull skips a refused value outside
// its budget of disagreements and for a day, and a stranger's bad record
// held by older peers must not end pulls because it is also too large.
func TestCheckRefusesABadValueBeforeTheBounds(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(13, 14))
	writer, stranger := newAuthor(t, rng), newAuthor(t, rng)
	n := startTestNet(t, &testNet{mn: mocknet.New(), trust: []peer.ID{writer.id},
		counts: func(p peer.ID) bool { return p == writer.id },
		value:  func(*Signed) error { return errors.New("not a record") }})
	e := stranger.write(t, n.clock.now(), "nodes/"+stranger.id.String(), strings.Repeat("x", MaxPendingRecord+1), false)
	if err := n.r.check(e, n.clock.now()); !errors.Is(err, ErrValueRefused) {
		t.Fatalf("a stranger's bad record past MaxPendingRecord: %v, want ErrValueRefused", err)
	}
}

// This node refuses to write a policy membership of its own past
// MaxPolicyMemberships, with the reason.
func TestOwnPolicyMembershipsAreBounded(t *testing.T) {
	n := startTestNet(t, &testNet{mn: mocknet.New()})
	r := n.r
	ctx := context.Background()
	self := r.self.String()
	for i := range MaxPolicyMemberships {
		if _, err := r.Put(ctx, fmt.Sprintf("tribes/t%d/members/%s/policy", i, self), []byte(`{}`)); err != nil {
			t.Fatalf("membership %d: %v", i, err)
		}
	}
	if _, err := r.Put(ctx, fmt.Sprintf("tribes/t%d/members/%s/policy", MaxPolicyMemberships, self), []byte(`{}`)); !errors.Is(err, ErrAuthorFull) {
		t.Fatalf("membership %d: %v, want ErrAuthorFull", MaxPolicyMemberships+1, err)
	}
	if _, err := r.Put(ctx, fmt.Sprintf("tribes/t0/members/%s/policy", self), []byte(`{"policies":["p"]}`)); err != nil {
		t.Fatalf("a held membership rewritten: %v", err)
	}
}

// A record of a node that does not count is taken no sooner than
// PendingRewrite after the one held, by their clocks, and that bound held
// only forwards: its author picks its clocks, so versions a second apart
// on this node's clock, each PendingRewrite after the last on theirs
// (starting in the past), or each at the held one's very clock with a
// higher hash (which wins that tie), were all taken, checked, stored and
// passed on. Each such version is now also taken no sooner than
// pendingRetake after this node took the one held, by its own clock.
func TestPendingRecordsRewrittenNoFasterThanTheBound(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(7, 8))
	writer, p := newAuthor(t, rng), newAuthor(t, rng)
	n := startTestNet(t, &testNet{mn: mocknet.New(), trust: []peer.ID{writer.id},
		counts: func(id peer.ID) bool { return id == writer.id }})
	r := n.r
	key := "nodes/" + p.id.String()
	at := func(hlc HLC, name string) *Signed {
		s, err := Sign(Entry{Key: key, Value: []byte(`{"name":"` + name + `"}`), HLC: hlc}, p.key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	past := MakeHLC(n.clock.now().Add(-time.Hour).UnixMilli(), 0)
	if _, err := r.Accept(p.id, at(past, "first").Raw); err != nil {
		t.Fatalf("a pending node's first record: %v", err)
	}
	n.clock.advance(time.Second)
	next := past + MakeHLC(PendingRewrite.Milliseconds(), 0)
	if _, err := r.Accept(p.id, at(next, "second").Raw); !errors.Is(err, ErrPendingTooSoon) {
		t.Fatalf("a version %v after the held one on its clock, a second later on ours: %v, want ErrPendingTooSoon", PendingRewrite, err)
	}
	held, _ := r.Get(key)
	var same *Signed
	for i := 0; same == nil; i++ {
		if s := at(held.HLC, fmt.Sprint("same", i)); s.newer(held) {
			same = s
		}
	}
	if _, err := r.Accept(p.id, same.Raw); !errors.Is(err, ErrPendingTooSoon) {
		t.Fatalf("a version at the held one's clock with a higher hash, a second later: %v, want ErrPendingTooSoon", err)
	}
	n.clock.advance(pendingRetake - time.Second)
	if _, err := r.Accept(p.id, at(next, "second").Raw); err != nil {
		t.Fatalf("the next version %v after this node took the held one: %v", pendingRetake, err)
	}
	if got := r.Rejected()["pending_too_soon"]; got != 2 {
		t.Fatalf("pending_too_soon %d, want 2", got)
	}
}

// This node's clock moves past the clocks it sees (so that a write made
// after seeing another wins over it), but only those of nodes that count:
// a stranger's record a minute ahead (taken: it is its own record) moved
// it as far, and the node's next writes were then refused, as from the
// future, by every node whose clock ran a moment behind this one's, and
// not passed on by them; a stranger could do so again with each record.
func TestStrangersClocksDoNotMoveThisNodes(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(9, 10))
	writer, stranger, admitted := newAuthor(t, rng), newAuthor(t, rng), newAuthor(t, rng)
	n := trustedNet(t, writer, admitted)
	r := n.r
	now := n.clock.now()
	ahead := now.Add(MaxClockSkew - time.Second)
	if _, err := r.Accept(stranger.id, stranger.write(t, ahead, "nodes/"+stranger.id.String(), "{}", false).Raw); err != nil {
		t.Fatalf("a stranger's record %v ahead: %v", MaxClockSkew-time.Second, err)
	}
	own, err := r.Put(t.Context(), "nodes/"+n.h.ID().String(), []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if own.HLC.Wall().After(now) {
		t.Fatalf("this node's write after a stranger's record %v ahead is %v ahead", ahead.Sub(now), own.HLC.Wall().Sub(now))
	}
	// A node that counts still moves it.
	if _, err := r.Accept(admitted.id, admitted.write(t, ahead, "nodes/"+admitted.id.String(), "{}", false).Raw); err != nil {
		t.Fatal(err)
	}
	if own, err = r.Put(t.Context(), "nodes/"+n.h.ID().String(), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if own.HLC.Wall().Before(ahead) {
		t.Fatalf("this node's write after an admitted node's record %v ahead is at %v", ahead.Sub(now), own.HLC.Wall().Sub(now))
	}
}
