package gossip

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
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
	loaded, skipped, err := LoadState(st, s, nil)
	if err != nil || loaded != 1 || skipped != 1 {
		t.Fatalf("loaded %d skipped %d: %v", loaded, skipped, err)
	}
	if _, ok := s.Get("tribes/core"); !ok {
		t.Fatal("trusted entry not loaded")
	}
	// An entry whose value the rules now refuse is skipped too.
	s = NewState(NewTrust(a.id))
	loaded, skipped, err = LoadState(st, s, func(e *Signed) error {
		if e.Key == "tribes/core" {
			return errors.New("refused")
		}
		return nil
	})
	if err != nil || loaded != 0 || skipped != 2 {
		t.Fatalf("with a value check: loaded %d skipped %d: %v", loaded, skipped, err)
	}
}

// A store an earlier version filled may hold an entry in bytes other
// than its own (see TestOpenRefusesAlteredEnvelopes): such a copy is
// skipped, as an entry the rules no longer allow is, not taken for
// damage that stops the agent; peers hold the entry itself.
func TestLoadSkipsAlteredEnvelopes(t *testing.T) {
	a := newAuthor(t, rand.New(rand.NewPCG(12, 12)))
	st, err := OpenStore(filepath.Join(t.TempDir(), StoreFile), false)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	good := a.write(t, t0, "tribes/core", "v", false)
	altered := *a.write(t, t0, "tribes/edge", "v", false)
	altered.Raw = append(slices.Clone(altered.Raw), 9<<3|2, 1, 'x') // an unknown field
	if err := st.Put(good, &altered); err != nil {
		t.Fatal(err)
	}
	s := NewState(NewTrust())
	loaded, skipped, err := LoadState(st, s, nil)
	if err != nil || loaded != 1 || skipped != 1 {
		t.Fatalf("loaded %d skipped %d: %v", loaded, skipped, err)
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
	if _, _, err := LoadState(st, NewState(NewTrust()), nil); !errors.Is(err, ErrCorruptStore) || !strings.Contains(err.Error(), path) {
		t.Fatalf("corrupt entry: %v", err)
	}
	st.Close()
}

// damagedStore writes a real store of signed entries and returns its bytes
// and bbolt's page size and the pages in use (leaf, branch, freelist).
func damagedStore(t *testing.T) (orig []byte, pageSize int, inUse map[int]string) {
	t.Helper()
	rng := rand.New(rand.NewPCG(13, 6))
	a := newAuthor(t, rng)
	path := filepath.Join(t.TempDir(), StoreFile)
	st, err := OpenStore(path, true)
	if err != nil {
		t.Fatal(err)
	}
	var es []*Signed
	for i := range 300 {
		es = append(es, a.write(t, t0, fmt.Sprintf("tribes/t%03d", i), strings.Repeat("v", 100), false))
	}
	if err := st.Put(es...); err != nil {
		t.Fatal(err)
	}
	inUse = map[int]string{}
	pageSize = st.db.Info().PageSize
	st.db.View(func(tx *bolt.Tx) error {
		for id := 2; int64(id*pageSize) < tx.Size(); id++ {
			if pi, err := tx.Page(id); err == nil && pi != nil && pi.Type != "free" {
				inUse[id] = pi.Type
			}
		}
		return nil
	})
	st.Close()
	if orig, err = os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	return orig, pageSize, inUse
}

// openAndLoad is what a node does with its store at start.
func openAndLoad(path string) error {
	st, err := OpenStore(path, false)
	if err != nil {
		return err
	}
	defer st.Close()
	_, _, err = LoadState(st, NewState(NewTrust()), nil)
	return err
}

func TestDamagedStoreIsAnErrorNotAPanic(t *testing.T) {
	orig, ps, inUse := damagedStore(t)
	rng := rand.New(rand.NewPCG(7, 7))
	overwrite := func(from, to int) []byte {
		b := bytes.Clone(orig)
		for i := from; i < to; i++ {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	type damage struct {
		name string
		b    []byte
	}
	cases := []damage{
		{"truncated to half", orig[:len(orig)/2]},
		{"truncated to one page", orig[:ps]},
		{"empty", []byte{}},
		{"meta pages overwritten", overwrite(0, 2*ps)},
	}
	for _, id := range slices.Sorted(maps.Keys(inUse)) {
		typ := inUse[id]
		cases = append(cases, damage{fmt.Sprintf("%s page %d overwritten", typ, id), overwrite(id*ps, (id+1)*ps)},
			// The page header kept: bbolt takes the page for what it says.
			damage{fmt.Sprintf("%s page %d overwritten after its header", typ, id), overwrite(id*ps+16, (id+1)*ps)})
	}
	if len(inUse) < 5 || !slices.Contains(slices.Collect(maps.Values(inUse)), "branch") {
		t.Fatalf("the store is too small to damage each kind of page: %v", inUse)
	}
	dir := t.TempDir()
	for _, c := range cases {
		name, b := c.name, c.b
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		err := openAndLoad(path)
		if !errors.Is(err, ErrCorruptStore) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "move it aside") {
			t.Errorf("%s: got %v, want the corrupt store error naming the file and what to do", name, err)
			continue
		}
		if got, _ := os.ReadFile(path); !bytes.Equal(got, b) {
			t.Errorf("%s: the damaged file was written to", name)
		}
		// The file is closed, and its lock released, whatever bbolt did.
		f, _ := os.Open(path)
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			t.Errorf("%s: the store is still locked: %v", name, err)
		}
		f.Close()
	}
	// The same bytes undamaged load.
	path := filepath.Join(dir, "intact")
	os.WriteFile(path, orig, 0o600)
	if err := openAndLoad(path); err != nil {
		t.Fatalf("intact store: %v", err)
	}
}

func TestLoadPassesOnTheCallersPanic(t *testing.T) {
	st, err := OpenStore(filepath.Join(t.TempDir(), StoreFile), true)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a := newAuthor(t, rand.New(rand.NewPCG(1, 1)))
	st.Put(a.write(t, t0, "tribes/x", "v", false))
	defer func() {
		if r := recover(); r != "caller's bug" {
			t.Fatalf("recovered %v", r)
		}
	}()
	st.Load(func(string, []byte) error { panic("caller's bug") })
	t.Fatal("the caller's panic was swallowed")
}

// Load guards its own reads: damage done under an open store (here, past
// OpenStore's checks) is an error too.
func TestLoadReportsDamageMetAfterOpen(t *testing.T) {
	orig, ps, inUse := damagedStore(t)
	path := filepath.Join(t.TempDir(), StoreFile)
	os.WriteFile(path, orig, 0o600)
	st, err := OpenStore(path, true)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ids := slices.Sorted(maps.Keys(inUse))
	id := ids[slices.IndexFunc(ids, func(id int) bool { return inUse[id] == "leaf" })]
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, ps)
	seeded{rand.New(rand.NewPCG(3, 3))}.Read(junk)
	f.WriteAt(junk, int64(id*ps))
	f.Close()
	if _, _, err := LoadState(st, NewState(NewTrust()), nil); !errors.Is(err, ErrCorruptStore) || !strings.Contains(err.Error(), path) {
		t.Fatalf("load over a damaged page: %v", err)
	}
}
