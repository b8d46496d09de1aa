package gossip

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// queued is how many commits wait for the commit lock.
func queued(r *Replica) int {
	r.commits.qmu.Lock()
	defer r.commits.qmu.Unlock()
	return len(r.commits.queue)
}

// Writes that arrive while a commit is under way are stored together, in
// one transaction (one disk sync), and each returns once its entry is
// stored and applied.
func TestWritesArrivingTogetherShareOneCommit(t *testing.T) {
	r := newTestNet(t).r
	ctx := context.Background()
	before := r.StoreCommits()
	r.commits.mu.Lock() // a commit under way
	const writers = 50
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for i := range writers {
		wg.Go(func() {
			_, err := r.Put(ctx, fmt.Sprintf("tribes/t%d", i), []byte("v"))
			errs <- err
		})
	}
	waitFor(t, func() bool { return queued(r) == writers })
	r.commits.mu.Unlock()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := r.StoreCommits() - before; got != 1 {
		t.Errorf("%d writes made %d commits, want 1", writers, got)
	}
	st := NewState(r.Trust())
	if _, _, err := LoadState(r.store, st, nil); err != nil {
		t.Fatal(err)
	}
	for i := range writers {
		key := fmt.Sprintf("tribes/t%d", i)
		if _, ok := r.Get(key); !ok {
			t.Errorf("%s not applied", key)
		}
		if _, ok := st.Get(key); !ok {
			t.Errorf("%s not stored", key)
		}
	}
}

// Two versions of one key committed together: the newer is stored and
// applied, whichever came first, and only its commit reports a change.
func TestACommitKeepsTheNewerOfOneKey(t *testing.T) {
	r := newTestNet(t).r
	a := newAuthor(t, rand.New(rand.NewPCG(3, 3)))
	now := time.Now()
	older := a.write(t, now, "tribes/x", "old", false)
	newer := a.write(t, now, "tribes/x", "new", false)
	r.commits.mu.Lock()
	changes := make([][]*Change, 2)
	var wg sync.WaitGroup
	for i, e := range []*Signed{newer, older} {
		wg.Go(func() {
			c, err := r.commit([]*Signed{e})
			if err != nil {
				t.Error(err)
			}
			changes[i] = c
		})
	}
	waitFor(t, func() bool { return queued(r) == 2 })
	r.commits.mu.Unlock()
	wg.Wait()
	if e, ok := r.Get("tribes/x"); !ok || string(e.Value) != "new" {
		t.Fatalf("held %v, want the newer", e)
	}
	if len(changes[0]) != 1 || len(changes[1]) != 0 {
		t.Errorf("changes: newer %d, older %d; want 1 and 0", len(changes[0]), len(changes[1]))
	}
	st := NewState(r.Trust())
	LoadState(r.store, st, nil)
	if e, ok := st.Get("tribes/x"); !ok || string(e.Value) != "new" {
		t.Fatalf("stored %v, want the newer", e)
	}
}

// storedValue is key's value in r's store ("" if it holds none).
func storedValue(t *testing.T, r *Replica, key string) string {
	t.Helper()
	st := NewState(r.Trust())
	if _, _, err := LoadState(r.store, st, nil); err != nil {
		t.Fatal(err)
	}
	e, ok := st.Get(key)
	if !ok {
		return ""
	}
	return string(e.Value)
}

// An entry written behind (another node keeps it) is applied at once and
// stored with the next commit, or a second later, or when the replica
// closes; one that no other node took is stored at once; one forgotten
// meanwhile is not stored.
func TestWrittenBehindIsStoredWithTheNextCommit(t *testing.T) {
	r := newTestNet(t).r
	ctx := context.Background()
	behind := func(key, value string, taken bool) {
		t.Helper()
		var sent *Signed
		s, err := r.PutBehind(ctx, key, []byte(value), func(s *Signed) bool { sent = s; return taken })
		if err != nil {
			t.Fatal(err)
		}
		if sent != s {
			t.Fatalf("sent %v, wrote %v", sent, s)
		}
		if got, ok := r.Get(key); !ok || got != s {
			t.Fatalf("%s not applied", key)
		}
	}
	before := r.StoreCommits()
	behind("tribes/a", "1", false)
	if got := storedValue(t, r, "tribes/a"); got != "1" || r.StoreCommits() != before+1 {
		t.Fatalf("not taken elsewhere: stored %q in %d commits, want it stored at once", got, r.StoreCommits()-before)
	}
	behind("tribes/b", "1", true)
	behind("tribes/b", "2", true)
	behind("tribes/gone", "1", true)
	if err := r.Forget("tribes/gone"); err != nil {
		t.Fatal(err)
	}
	if got := storedValue(t, r, "tribes/b"); got != "" || r.StoreCommits() != before+2 {
		t.Fatalf("written behind: stored %q, %d commits; want neither stored nor committed", got, r.StoreCommits()-before-1)
	}
	if _, err := r.Put(ctx, "tribes/c", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if b, c := storedValue(t, r, "tribes/b"), storedValue(t, r, "tribes/c"); b != "2" || c != "1" || r.StoreCommits() != before+3 {
		t.Fatalf("the next write stored b=%q c=%q in %d commits; want b=2 c=1 in one", b, c, r.StoreCommits()-before-2)
	}
	if got := storedValue(t, r, "tribes/gone"); got != "" {
		t.Errorf("a key forgotten while behind was stored: %q", got)
	}
	behind("tribes/d", "1", true)
	waitFor(t, func() bool { return storedValue(t, r, "tribes/d") == "1" })
	behind("tribes/e", "1", true)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if got := storedValue(t, r, "tribes/e"); got != "1" {
		t.Errorf("written behind just before the replica closed: stored %q", got)
	}
}

// Entries that came by pubsub or anti-entropy are applied at once; those
// of broadcast kinds are stored with the next commit, or a second later,
// and direct ones (a job's acks, held by few) before they are applied.
func TestGossipedEntriesStoredBehind(t *testing.T) {
	r := newTestNet(t).r
	r.cfg.Direct = DirectKey
	a := newAuthor(t, rand.New(rand.NewPCG(5, 5)))
	now := time.Now()
	broadcast := a.write(t, now, "tribes/x", "1", false)
	ack := a.write(t, now, "jobs/j1/acks/"+a.id.String(), "{}", false)
	before := r.StoreCommits()
	if changes := r.applyGossiped([]*Signed{broadcast, ack}); len(changes) != 2 {
		t.Fatalf("%d changes, want 2", len(changes))
	}
	for _, e := range []*Signed{broadcast, ack} {
		if got, ok := r.Get(e.Key); !ok || got != e {
			t.Fatalf("%s not applied", e.Key)
		}
	}
	if storedValue(t, r, ack.Key) != "{}" || storedValue(t, r, broadcast.Key) != "" || r.StoreCommits() != before+1 {
		t.Fatalf("stored: ack %q, broadcast %q, in %d commits; want the ack alone, in one",
			storedValue(t, r, ack.Key), storedValue(t, r, broadcast.Key), r.StoreCommits()-before)
	}
	// An older copy arriving later changes nothing.
	if changes := r.applyGossiped([]*Signed{broadcast}); len(changes) != 0 {
		t.Fatalf("the same entry again made %d changes", len(changes))
	}
	waitFor(t, func() bool { return storedValue(t, r, broadcast.Key) == "1" })
}

// A replica that crashes does not store what waits to be stored, as a
// killed process would not.
func TestCrashLosesWhatIsBehind(t *testing.T) {
	r := newTestNet(t).r
	if _, err := r.PutBehind(context.Background(), "tribes/x", []byte("1"), func(*Signed) bool { return true }); err != nil {
		t.Fatal(err)
	}
	if err := r.Crash(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.commit(nil); err != nil { // what the flush would have done
		t.Fatal(err)
	}
	if got := storedValue(t, r, "tribes/x"); got != "" {
		t.Fatalf("stored %q after a crash", got)
	}
}
