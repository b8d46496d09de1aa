package gossip

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func TestStoreRoundTripAndTrustChanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 11))
	a, b := newAuthor(t, rng), newAuthor(t, rng)
	path := filepath.Join(t.TempDir(), StoreFile)
	st, err := OpenStore(path, false)
	if err != nil {
		t.Fatal(err)
	}
	e1 := a.write(t, t0, "tribes/core", "v", false)
	e2 := b.write(t, t0, "tribes/edge", "v", false)
	if err := st.Put(e1, e2); err != nil {
		t.Fatal(err)
	}
	st.Close()

	st, err = OpenStore(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := NewState(NewTrust(a.id)) // b is no longer trusted
	loaded, skipped, err := LoadState(st, s)
	if err != nil || loaded != 1 || skipped != 1 {
		t.Fatalf("loaded %d skipped %d: %v", loaded, skipped, err)
	}
	if _, ok := s.Get("tribes/core"); !ok {
		t.Fatal("trusted entry not loaded")
	}
}

func TestCorruptStoreIsReportedNotReset(t *testing.T) {
	dir := t.TempDir()
	// Not a bbolt file at all.
	garbage := filepath.Join(dir, "garbage.db")
	os.WriteFile(garbage, []byte(strings.Repeat("x", 8192)), 0o600)
	if _, err := OpenStore(garbage, false); err == nil || !strings.Contains(err.Error(), "move it aside") {
		t.Fatalf("garbage store: %v", err)
	}
	if b, _ := os.ReadFile(garbage); len(b) != 8192 {
		t.Fatal("garbage store was modified")
	}
	// A valid bbolt file holding bytes that are not an entry.
	path := filepath.Join(dir, StoreFile)
	st, err := OpenStore(path, false)
	if err != nil {
		t.Fatal(err)
	}
	st.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(entriesBucket).Put([]byte("tribes/x"), []byte("junk")) })
	if _, _, err := LoadState(st, NewState(NewTrust())); !errors.Is(err, ErrCorruptStore) || !strings.Contains(err.Error(), path) {
		t.Fatalf("corrupt entry: %v", err)
	}
	st.Close()
}
