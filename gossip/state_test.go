package gossip

import (
	crand "crypto/rand"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/record"
	recordpb "github.com/libp2p/go-libp2p/core/record/pb"
	"google.golang.org/protobuf/proto"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

type author struct {
	key crypto.PrivKey
	id  peer.ID
	hlc HLC
}

func newAuthor(t testing.TB, rng *rand.Rand) *author {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(seeded{rng})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(k)
	return &author{key: k, id: id}
}

type seeded struct{ rng *rand.Rand }

func (s seeded) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(s.rng.Uint32())
	}
	return len(p), nil
}

// write makes a signed entry by a at wall time now.
func (a *author) write(t testing.TB, now time.Time, key, value string, deleted bool) *Signed {
	t.Helper()
	a.hlc = Next(a.hlc, now)
	s, err := Sign(Entry{Key: key, Value: []byte(value), HLC: a.hlc, Deleted: deleted}, a.key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// pullAll pulls everything dst lacks from src, through the wire codec, and
// returns the bytes that crossed.
func pullAll(t testing.TB, dst, src *State, now time.Time) (sent int) {
	t.Helper()
	return pullScoped(t, dst, src, now, Full)
}

// pullScoped is pullAll in scope sc.
func pullScoped(t testing.TB, dst, src *State, now time.Time, sc Scope) (sent int) {
	t.Helper()
	req := dst.StartPull(sc)
	for round := 0; ; round++ {
		if round > maxRounds {
			t.Fatal("pull did not finish")
		}
		qb := EncodeRequest(req)
		dreq, err := DecodeRequest(qb)
		if err != nil {
			t.Fatal(err)
		}
		// An honest request always passes the responder's checks.
		if err := CheckRequest(dreq); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		rb := EncodeResponse(src.Respond(dreq, 1<<20, sc))
		sent += len(qb) + len(rb)
		resp, err := DecodeResponse(rb)
		if err != nil {
			t.Fatal(err)
		}
		// An honest answer always passes the puller's checks.
		if err := CheckResponse(req, resp); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		wanted := ServedWants(req, resp)
		for _, raw := range resp.Entries {
			e, err := Open(raw)
			if err != nil {
				t.Fatal(err)
			}
			if !wanted[keyHash(e.Key)] {
				t.Fatalf("round %d: %s served but not wanted", round, e.Key)
			}
			delete(wanted, keyHash(e.Key))
			dst.Apply(e, now)
		}
		next, done := dst.NextPull(req, resp, sc, nil)
		if done {
			return sent
		}
		req = next
	}
}

// Two envelopes an author signed for one key with one clock and different
// bodies: every replica ends with the same one (the higher hash), in
// whichever order they came, so their digests agree and anti-entropy
// between them ends.
func TestSameVersionTwoBodiesConverge(t *testing.T) {
	a := newAuthor(t, rand.New(rand.NewPCG(7, 7)))
	key := "nodes/" + a.id.String()
	hlc := MakeHLC(t0.UnixMilli(), 0)
	v1, err1 := Sign(Entry{Key: key, Value: []byte(`{"name":"alpha"}`), HLC: hlc}, a.key)
	v2, err2 := Sign(Entry{Key: key, Value: []byte(`{"name":"beta"}`), HLC: hlc}, a.key)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	x, y := NewState(NewTrust()), NewState(NewTrust())
	x.Apply(v1, t0)
	y.Apply(v2, t0)
	pullAll(t, x, y, t0)
	pullAll(t, y, x, t0)
	ex, _ := x.Get(key)
	ey, _ := y.Get(key)
	if x.Root() != y.Root() || ex.Hash != ey.Hash {
		t.Fatalf("replicas differ: one holds %s, the other %s", ex.Value, ey.Value)
	}
}

// Random writes by several authors (each with its own clock), delivered
// to each replica in its own random order with duplicates and drops, then
// anti-entropy in a ring: every replica ends with the same state, and the
// state holds for each key the write with the highest (HLC, author).
func TestPropertyConvergence(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			authors := []*author{newAuthor(t, rng), newAuthor(t, rng), newAuthor(t, rng)}
			trust := NewTrust()
			var writes []*Signed
			keys := []string{"tribes/a", "tribes/b", "policies/p", "tribes/a/tasks/t1", "tribes/c"}
			for i := range 200 {
				a := authors[rng.IntN(len(authors))]
				now := t0.Add(time.Duration(rng.IntN(5000)) * time.Millisecond) // clocks that disagree
				writes = append(writes, a.write(t, now, keys[rng.IntN(len(keys))], fmt.Sprint(i), rng.IntN(4) == 0))
			}
			// The winner of each key among the writes that reached at
			// least one replica.
			want := map[string]*Signed{}
			delivered := func(w *Signed) {
				if o := want[w.Key]; o == nil || w.newer(o) {
					want[w.Key] = w
				}
			}

			replicas := make([]*State, 4)
			for r := range replicas {
				replicas[r] = NewState(trust)
				order := rng.Perm(len(writes))
				for _, i := range order {
					if rng.IntN(5) == 0 {
						continue // dropped
					}
					delivered(writes[i])
					for range 1 + rng.IntN(2) { // maybe duplicated
						if _, err := replicas[r].Apply(writes[i], t0.Add(time.Hour)); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			// Each pass moves a version one step back along the ring, so
			// len-1 passes reach everyone.
			now := t0.Add(time.Hour)
			for range len(replicas) - 1 {
				for r := range replicas {
					pullAll(t, replicas[r], replicas[(r+1)%len(replicas)], now)
				}
			}
			for r, s := range replicas {
				if s.Hash() != replicas[0].Hash() || s.Root() != replicas[0].Root() {
					t.Fatalf("replica %d differs from replica 0", r)
				}
				for k, w := range want {
					got, ok := s.Version(k)
					if !ok || got.Hash != w.Hash {
						t.Fatalf("replica %d holds the wrong version of %s: got %v/%s del=%v want %v/%s del=%v ok=%v", r, k, got.HLC, got.Author, got.Deleted, w.HLC, w.Author, w.Deleted, ok)
					}
				}
			}
		})
	}
}

func TestTombstonesAndRecreation(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	a := newAuthor(t, rng)
	s := NewState(NewTrust())
	now := t0
	s.Apply(a.write(t, now, "tribes/core", "v1", false), now)
	del := a.write(t, now, "tribes/core", "", true)
	if c, err := s.Apply(del, now); err != nil || c == nil {
		t.Fatalf("delete: %v %v", c, err)
	}
	if _, ok := s.Get("tribes/core"); ok {
		t.Fatal("deleted key still visible")
	}
	if len(s.Prefix("tribes/")) != 0 {
		t.Fatal("deleted key listed")
	}
	// A re-creation after the delete wins; a stale write from before does not.
	stale, _ := Sign(Entry{Key: "tribes/core", Value: []byte("old"), HLC: del.HLC - 5}, a.key)
	if c, _ := s.Apply(stale, now); c != nil {
		t.Fatal("a write older than the tombstone resurrected the key")
	}
	s.Apply(a.write(t, now, "tribes/core", "v2", false), now)
	if e, ok := s.Get("tribes/core"); !ok || string(e.Value) != "v2" {
		t.Fatal("re-creation after delete not visible")
	}
	// A collected kind's tombstones go after the grace period, not before.
	gone := "tribes/gone/members/" + a.id.String() + "/policy"
	s.Apply(a.write(t, now, gone, "", true), now)
	if got := s.Collect(now.Add(TombstoneGrace-time.Minute), TombstoneGrace); len(got) != 0 {
		t.Fatalf("collected early: %v", got)
	}
	if got := s.Collect(now.Add(TombstoneGrace+time.Minute), TombstoneGrace); len(got) != 1 || got[0] != gone {
		t.Fatalf("collected %v", got)
	}
	if _, ok := s.Version(gone); ok {
		t.Fatal("collected tombstone still held")
	}
	if _, ok := s.Get("tribes/core"); !ok {
		t.Fatal("live key collected")
	}
}

// A trusted writer's deletion withdraws authority: its tombstone is never
// collected, so the entry it deleted, replayed by whoever kept it, is
// refused a year later as it was the day after.
func TestTrustedTombstonesOutliveReplays(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	writer, member := newAuthor(t, rng), newAuthor(t, rng)
	s := NewState(NewTrust(writer.id))
	now := t0
	m := member.id.String()
	for _, key := range []string{
		"tribes/web/members/" + m + "/manual",
		"tribes/web/plugins/exec",
		"tribes/web/tasks/t-1",
		"tribes/web",
		"policies/web",
		"admitted/" + m,
		"forced/" + m,
	} {
		kept := writer.write(t, now, key, `{"v":1}`, false)
		if c, err := s.Apply(kept, now); err != nil || c == nil {
			t.Fatalf("%s: %v %v", key, c, err)
		}
		if c, err := s.Apply(writer.write(t, now, key, "", true), now); err != nil || c == nil {
			t.Fatalf("delete %s: %v %v", key, c, err)
		}
		later := now.Add(TombstoneGrace + 365*24*time.Hour)
		if got := s.Collect(later, TombstoneGrace); len(got) != 0 {
			t.Fatalf("%s: collected %v", key, got)
		}
		if c, _ := s.Apply(kept, later); c != nil {
			t.Fatalf("%s: a replay of the deleted entry was taken a year on", key)
		}
		if _, ok := s.Get(key); ok {
			t.Fatalf("%s: the replay is visible", key)
		}
	}
	// A job's tombstone is collected: it was deleted past its expiry.
	job := writer.write(t, now, "jobs/19ab3c-01", "", true)
	s.Apply(job, now)
	if got := s.Collect(now.Add(TombstoneGrace+time.Minute), TombstoneGrace); !slices.Equal(got, []string{"jobs/19ab3c-01"}) {
		t.Fatalf("collected %v, want the job's tombstone", got)
	}
}

func TestApplyRefusesAndChangesNothing(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	trusted, outsider := newAuthor(t, rng), newAuthor(t, rng)
	s := NewState(NewTrust(trusted.id))
	s.Apply(trusted.write(t, t0, "tribes/core", "v", false), t0)
	before := s.Hash()
	cases := []struct {
		name string
		e    *Signed
		want error
	}{
		{"untrusted writer", outsider.write(t, t0, "tribes/core", "x", false), ErrUnauthorized},
		{"someone else's node record", trusted.write(t, t0, "nodes/"+outsider.id.String(), "x", false), ErrUnauthorized},
		{"someone else's policy membership", trusted.write(t, t0, "tribes/core/members/"+outsider.id.String()+"/policy", "x", false), ErrUnauthorized},
		{"untrusted force-leave", outsider.write(t, t0, "forced/"+trusted.id.String(), "{}", false), ErrUnauthorized},
		{"force-leave of itself, untrusted", outsider.write(t, t0, "forced/"+outsider.id.String(), "{}", false), ErrUnauthorized},
		{"untrusted job", outsider.write(t, t0, "jobs/j1", "{}", false), ErrUnauthorized},
		{"an ack for another node", outsider.write(t, t0, "jobs/j1/acks/"+trusted.id.String(), "{}", false), ErrUnauthorized},
		{"an ack for another node, by a trusted writer", trusted.write(t, t0, "jobs/j1/acks/"+outsider.id.String(), "{}", false), ErrUnauthorized},
		{"unknown key kind", trusted.write(t, t0, "secrets/x", "x", false), ErrUnknownKey},
		{"bad tribe name", trusted.write(t, t0, "tribes/Core!", "x", false), ErrUnknownKey},
		{"from the future", trusted.write(t, t0.Add(2*time.Minute), "tribes/core", "x", false), ErrFromFuture},
	}
	for _, tc := range cases {
		if _, err := s.Apply(tc.e, t0); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	if s.Hash() != before {
		t.Fatal("a refused entry changed the state")
	}
	// Own records and own policy membership are fine for anyone.
	if _, err := s.Apply(outsider.write(t, t0, "nodes/"+outsider.id.String(), "me", false), t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(outsider.write(t, t0, "tribes/core/members/"+outsider.id.String()+"/policy", "1", false), t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(outsider.write(t, t0, "jobs/j1/acks/"+outsider.id.String(), "{}", false), t0); err != nil {
		t.Fatal("a node's own ack:", err)
	}
}

func TestOpenRefusesForgeries(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	a, b := newAuthor(t, rng), newAuthor(t, rng)
	good := a.write(t, t0, "tribes/core", "v", false)
	if _, err := Open(good.Raw); err != nil {
		t.Fatal(err)
	}
	flipped := append([]byte(nil), good.Raw...)
	flipped[len(flipped)-10] ^= 1 // inside the signature
	if _, err := Open(flipped); !errors.Is(err, ErrBadSig) && !errors.Is(err, ErrMalformed) {
		t.Fatalf("flipped signature: %v", err)
	}
	// b signs an entry that claims a as its author.
	env, err := sealAs(&payload{Entry{Key: "tribes/core", HLC: 1, Author: a.id}}, b.key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(env); !errors.Is(err, ErrBadSigner) {
		t.Fatalf("entry signed by someone else than its author: %v", err)
	}
	if _, err := Open([]byte("garbage")); !errors.Is(err, ErrMalformed) {
		t.Fatalf("garbage: %v", err)
	}
	if _, err := Open(make([]byte, MaxEntrySize+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized: %v", err)
	}
}

// An envelope's bytes are not all signed: protobuf takes fields it does
// not know and a field given twice (the last counts). Anyone holding an
// entry could so make copies of it that open to the same entry under
// other bytes, another hash: the higher hash won the tie of one author's
// one clock, so a stranger's copy padded to MaxEntrySize replaced a
// trusted writer's entry on every node, and each copy was a new pubsub
// message (IDs are content hashes) that every node checked and passed on.
// Only the bytes Sign writes open.
func TestOpenRefusesAlteredEnvelopes(t *testing.T) {
	a := newAuthor(t, rand.New(rand.NewPCG(4, 4)))
	good := a.write(t, t0, "tribes/core", "v", false)
	field := func(num byte, data []byte) []byte { // a length-delimited field
		return append([]byte{num<<3 | 2, byte(len(data))}, data...)
	}
	for name, raw := range map[string][]byte{
		"an unknown field after":  append(slices.Clone(good.Raw), field(9, []byte("padding"))...),
		"an unknown field before": append(field(15, []byte("x")), good.Raw...),
		"the payload twice":       append(field(3, []byte("junk")), good.Raw...),
		"the payload type twice":  append(field(2, []byte("/tribe/entry/1")), good.Raw...),
	} {
		e, err := Open(raw)
		if !errors.Is(err, ErrNotCanonical) || !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrNotCanonical", name, err)
		}
		if e != nil {
			t.Errorf("%s: opened to %s (hash %x, the original's %x)", name, e.Key, e.Hash[:4], good.Hash[:4])
		}
	}
}

// An entry signed with a key no agent has (agents sign with Ed25519) is
// refused before its signature is checked, and so is one signed by
// another than its author: neither costs a signature check.
func TestOpenRefusesSignersNoAgentIs(t *testing.T) {
	ecdsa, _, err := crypto.GenerateECDSAKeyPair(crand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(ecdsa)
	s, err := Sign(Entry{Key: "nodes/" + id.String(), Author: id, HLC: 1, Value: []byte("{}")}, ecdsa)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(s.Raw); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "ECDSA") {
		t.Errorf("an ECDSA-signed entry: %v, want refused as malformed", err)
	}

	a, b := newAuthor(t, rand.New(rand.NewPCG(5, 5))), newAuthor(t, rand.New(rand.NewPCG(6, 6)))
	good := a.write(t, t0, "tribes/core", "v", false)
	var env recordpb.Envelope
	if err := proto.Unmarshal(good.Raw, &env); err != nil {
		t.Fatal(err)
	}
	// b's key on a's payload and signature: the signature is not b's
	// either, but the signer is refused before it is checked.
	pk, _ := crypto.PublicKeyToProto(b.key.GetPublic())
	env.PublicKey = pk
	raw, _ := proto.Marshal(&env)
	if _, err := Open(raw); !errors.Is(err, ErrBadSigner) {
		t.Errorf("a's entry under b's key: %v, want ErrBadSigner", err)
	}
}

func TestAuthTableClassifiesEveryKind(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	p := newAuthor(t, rng).id.String()
	examples := map[string]string{
		"node":          "nodes/" + p,
		"admission":     "admitted/" + p,
		"tribe":         "tribes/core",
		"member-manual": "tribes/core/members/" + p + "/manual",
		"member-policy": "tribes/core/members/" + p + "/policy",
		"policy":        "policies/storage",
		"plugin":        "tribes/core/plugins/exec",
		"task":          "tribes/core/tasks/t-1",
		"forced":        "forced/" + p,
		"job":           "jobs/19ab3c-01",
		"job-ack":       "jobs/19ab3c-01/acks/" + p,
	}
	seen := map[string]bool{}
	for _, k := range Kinds {
		ex, ok := examples[k.Name]
		if !ok {
			t.Errorf("kind %s has no example here: add one", k.Name)
			continue
		}
		got, err := Classify(ex)
		if err != nil || got.Name != k.Name {
			t.Errorf("Classify(%q) = %v, %v; want %s", ex, got.Name, err, k.Name)
		}
		if k.Writer != Self && k.Writer != Trusted {
			t.Errorf("kind %s has no writer rule", k.Name)
		}
		// A trusted writer's deletions are kept (see Kind.Collected):
		// a kind collected here says on its row why a replay is harmless.
		if want := k.Writer == Self || k.Name == "job"; k.Collected != want {
			t.Errorf("kind %s: Collected = %v, want %v", k.Name, k.Collected, want)
		}
		seen[k.Name] = true
	}
	if len(seen) != len(examples) {
		t.Errorf("examples name kinds the table lacks: %v vs %v", examples, seen)
	}
	for _, bad := range []string{"", "nodes", "nodes/not-a-peer", "tribes", "tribes/a/b", "tribes/core/members/" + p + "/other", "x/y", "tribes//plugins/x", "policies/UPPER", "admitted", "admitted/not-a-peer", "admitted/" + cidForm(t, p), "forced", "forced/not-a-peer", "forced/" + cidForm(t, p), "jobs", "jobs/J!", "jobs/j1/acks", "jobs/j1/acks/not-a-peer", "jobs/j1/other/" + p} {
		if _, err := Classify(bad); !errors.Is(err, ErrUnknownKey) {
			t.Errorf("Classify(%q) = %v, want ErrUnknownKey", bad, err)
		}
	}
}

func TestHLC(t *testing.T) {
	last := MakeHLC(t0.UnixMilli(), 0)
	if got := Next(last, t0); got != last+1 {
		t.Errorf("same millisecond: %v, want last+1", got)
	}
	if got := Next(last, t0.Add(-time.Second)); got != last+1 {
		t.Errorf("clock went back: %v, want last+1", got)
	}
	if got := Next(last, t0.Add(time.Second)); got != MakeHLC(t0.Add(time.Second).UnixMilli(), 0) {
		t.Errorf("clock ahead: %v", got)
	}
	if Observe(last, last+10) != last+10 || Observe(last+10, last) != last+10 {
		t.Error("Observe does not keep the maximum")
	}
	if !MakeHLC(t0.UnixMilli(), 3).Wall().Equal(t0) || MakeHLC(5, 3).Logical() != 3 {
		t.Error("HLC parts")
	}
}

// sealAs signs p with key whoever p claims as author.
func sealAs(p *payload, key crypto.PrivKey) ([]byte, error) {
	env, err := record.Seal(p, key)
	if err != nil {
		return nil, err
	}
	return env.Marshal()
}

// cidForm is p's peer ID in its CIDv1 encoding, which peer.Decode also
// reads: not the canonical key of p.
func cidForm(t *testing.T, p string) string {
	t.Helper()
	id, err := peer.Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	c := peer.ToCid(id).String()
	if back, err := peer.Decode(c); err != nil || back != id || c == p {
		t.Fatalf("CIDv1 form %q of %s: %v", c, p, err)
	}
	return c
}

// Prefix walks an ordered index of the keys: after random writes, deletes
// and collections it lists exactly what a scan of every entry finds, in
// key order.
func TestPrefixMatchesAScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	a := newAuthor(t, rng)
	s := NewState(NewTrust())
	now := t0
	names := []string{"a", "ab", "a.b", "a-", "b", "b0"}
	name := func() string { return names[rng.IntN(len(names))] }
	key := func() string {
		switch rng.IntN(3) {
		case 0:
			return "tribes/" + name()
		case 1:
			return "tribes/" + name() + "/plugins/" + name()
		}
		return "tribes/" + name() + "/tasks/" + name()
	}
	prefix := func() string {
		k := key()
		return k[:rng.IntN(len(k)+1)]
	}
	for i := range 3000 {
		now = now.Add(time.Second)
		if _, err := s.Apply(a.write(t, now, key(), "v", rng.IntN(3) == 0), now); err != nil {
			t.Fatal(err)
		}
		if i%500 == 499 {
			s.Collect(now, time.Duration(rng.IntN(600))*time.Second)
		}
		p := prefix()
		var want []string
		for k, e := range s.entries {
			if !e.Deleted && strings.HasPrefix(k, p) {
				want = append(want, k)
			}
		}
		slices.Sort(want)
		var got []string
		for _, e := range s.Prefix(p) {
			got = append(got, e.Key)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("step %d, Prefix(%q): %v, want %v", i, p, got, want)
		}
	}
	if s.keys.Len() != len(s.entries) {
		t.Fatalf("%d keys indexed for %d entries", s.keys.Len(), len(s.entries))
	}
}

// Children lists exactly the live keys one segment below the prefix, and
// Segments the segments of all keys there, as a scan of every entry finds
// them, skipping whole subtrees.
func TestChildrenMatchesAScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	a := newAuthor(t, rng)
	s := NewState(NewTrust())
	now := t0
	ids := []string{"a", "a-b", "a.c", "a0", "ab", "b", "b_1"}
	for i := range 2000 {
		now = now.Add(time.Second)
		id := ids[rng.IntN(len(ids))]
		key := "tribes/" + id
		switch rng.IntN(3) {
		case 0:
			key += "/plugins/" + ids[rng.IntN(len(ids))]
		case 1:
			key += "/tasks/" + ids[rng.IntN(len(ids))]
		}
		if _, err := s.Apply(a.write(t, now, key, "v", rng.IntN(4) == 0), now); err != nil {
			t.Fatal(err)
		}
		// Under jobs/, mostly subtrees whose own key is not held: a
		// job's acks after the job was forgotten.
		job := "jobs/" + ids[rng.IntN(len(ids))]
		if rng.IntN(5) > 0 || job == "jobs/a" { // a's own key never: its acks follow a-b's and a.c's
			job += "/acks/" + a.id.String()
		}
		if _, err := s.Apply(a.write(t, now, job, "v", rng.IntN(4) == 0), now); err != nil {
			t.Fatal(err)
		}
		if i%100 != 99 {
			continue
		}
		var want []string
		for k, e := range s.entries {
			if !e.Deleted && strings.HasPrefix(k, "tribes/") && !strings.Contains(k[len("tribes/"):], "/") {
				want = append(want, k)
			}
		}
		slices.Sort(want)
		var got []string
		for _, e := range s.Children("tribes/") {
			got = append(got, e.Key)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("step %d: Children %v, want %v", i, got, want)
		}
		// Segments: the first segment of every key held, deleted or not.
		for _, prefix := range []string{"tribes/", "jobs/"} {
			segs := map[string]bool{}
			for k := range s.entries {
				if rest, ok := strings.CutPrefix(k, prefix); ok {
					seg, _, _ := strings.Cut(rest, "/")
					segs[seg] = true
				}
			}
			want := slices.Sorted(maps.Keys(segs))
			if got := s.Segments(prefix); !slices.Equal(got, want) {
				t.Fatalf("step %d: Segments(%q) %v, want %v", i, prefix, got, want)
			}
		}
	}
}

// The per-author counts (Kind.MaxPerAuthor) match a scan of the keys held
// whatever the order of writes, deletions, replays, forgets and
// collections, and a state loaded from the store counts as the one that
// stored it.
func TestPerAuthorCountsMatchAScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	authors := []*author{newAuthor(t, rng), newAuthor(t, rng), newAuthor(t, rng)}
	store, err := OpenStore(filepath.Join(t.TempDir(), StoreFile), true)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	s := NewState(NewTrust())
	scan := func(s *State) map[authorKind]int {
		want := map[authorKind]int{}
		for k, e := range s.entries {
			if kind, ok := bounded(k); ok {
				want[authorKind{kind.Name, e.Author}]++
			}
		}
		return want
	}
	now := t0
	var written []*Signed
	for i := range 5000 {
		now = now.Add(time.Duration(rng.IntN(3600)) * time.Second)
		a := authors[rng.IntN(len(authors))]
		var key string
		switch tribe := fmt.Sprintf("t%d", rng.IntN(40)); rng.IntN(4) {
		case 0:
			key = "tribes/" + tribe + "/members/" + a.id.String() + "/manual" // not bounded
		case 1:
			key = "nodes/" + a.id.String()
		default:
			key = "tribes/" + tribe + "/members/" + a.id.String() + "/policy"
		}
		switch op := rng.IntN(10); {
		case op < 6:
			e := a.write(t, now, key, `{}`, rng.IntN(2) == 0)
			written = append(written, e)
			if _, err := s.Apply(e, now); err != nil {
				t.Fatal(err)
			}
			if err := store.Put(e); err != nil {
				t.Fatal(err)
			}
		case op < 8: // a replay: an older version, or the same again
			e := written[rng.IntN(len(written))]
			if c, err := s.Apply(e, now); err != nil {
				t.Fatal(err)
			} else if c != nil {
				if err := store.Put(e); err != nil {
					t.Fatal(err)
				}
			}
		case op < 9:
			if s.forget(key) != nil {
				if err := store.Delete(key); err != nil {
					t.Fatal(err)
				}
			}
		default:
			if err := store.Delete(s.Collect(now, time.Duration(rng.IntN(48))*time.Hour)...); err != nil {
				t.Fatal(err)
			}
		}
		if got, want := s.perAuthor, scan(s); !maps.Equal(got, want) {
			t.Fatalf("step %d: counts %v, a scan finds %v", i, got, want)
		}
		if i%1000 == 999 {
			loaded := NewState(NewTrust())
			if _, _, err := LoadState(store, loaded, nil); err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(loaded.perAuthor, s.perAuthor) || loaded.Hash() != s.Hash() {
				t.Fatalf("step %d: loaded from the store, counts %v, want %v", i, loaded.perAuthor, s.perAuthor)
			}
		}
	}
}
