package gossip

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// StoreFile is the state store's file name inside the data dir.
const StoreFile = "state.db"

var entriesBucket = []byte("entries")

// ErrCorruptStore is returned when the store file is damaged (truncated,
// overwritten, emptied) or holds bytes that are not a valid entry. The
// store is never reset silently: the operator moves the file aside.
var ErrCorruptStore = errors.New("gossip: state store is corrupt")

// corrupt is the error for a damaged store at path, with what to do.
func corrupt(path, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s (move it aside: the node fetches the fleet's state again from its peers)",
		ErrCorruptStore, path, fmt.Sprintf(format, args...))
}

// Store keeps the signed entries on disk (bbolt), key to envelope.
type Store struct {
	db      *bolt.DB
	path    string
	commits atomic.Int64 // write transactions, each a disk sync
}

// Commits is how many write transactions the store made: each one syncs
// the disk (twice, data then meta) unless syncing is off.
func (s *Store) Commits() int64 { return s.commits.Load() }

// OpenStore opens or creates the store at path. noSync skips fsync on
// commit: only for simulations, where durability is not under test.
//
// An existing file is checked through before it is opened for writing
// (see verify); a damaged one, or an empty one, is an error wrapping
// ErrCorruptStore and is left as it was.
func OpenStore(path string, noSync bool) (*Store, error) {
	switch fi, err := os.Stat(path); {
	case err == nil && fi.Size() == 0:
		// bbolt would make a new store of it: but a store is never 0
		// bytes, so this one was emptied or never finished.
		return nil, corrupt(path, "the file is empty")
	case err == nil:
		if err := verify(path); err != nil {
			return nil, err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("gossip: state store: %w", err)
	}
	db, err := openBolt(path, &bolt.Options{Timeout: time.Second, NoSync: noSync})
	if err != nil {
		return nil, err
	}
	err = guard(func() error {
		return db.Update(func(tx *bolt.Tx) error {
			_, err := tx.CreateBucketIfNotExists(entriesBucket)
			return err
		})
	}, path, nil)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("gossip: state store %s: %w", path, err)
	}
	return &Store{db: db, path: path}, nil
}

// openBolt opens the bbolt file at path. bbolt trusts the file's bytes and
// panics (or faults reading past its mapping) on some damage: that is an
// error here, and the file is closed, which releases its lock. The mapping
// of a panicked open cannot be reached to unmap; the agent stops anyway.
func openBolt(path string, opts *bolt.Options) (*bolt.DB, error) {
	var file *os.File
	var openErr error
	opts.OpenFile = func(name string, flag int, perm os.FileMode) (*os.File, error) {
		file, openErr = os.OpenFile(name, flag, perm)
		return file, openErr
	}
	var db *bolt.DB
	err := guard(func() error {
		var err error
		db, err = bolt.Open(path, 0o600, opts)
		return err
	}, path, nil)
	switch {
	case err == nil:
		return db, nil
	case openErr != nil || file == nil:
		return nil, fmt.Errorf("gossip: open state store: %w", err)
	case errors.Is(err, ErrCorruptStore):
		file.Close() // bbolt panicked; after an error it closes the file itself
		return nil, err
	case errors.Is(err, bolt.ErrTimeout):
		return nil, fmt.Errorf("gossip: state store %s is locked by another process: %w", path, err)
	}
	// The file opened and locked: what failed is reading its pages.
	return nil, corrupt(path, "%v", err)
}

// verify checks an existing store through, read-only, so that a damaged
// file is reported at start and never written to: the file holds every
// page the store says it has, every page of entries is visited and its
// keys read in order, then bbolt's consistency check runs (each page
// referenced once, free pages not in use, the tree's key order). On a
// store of 100,000 entries (90 MB) the walk took 60-240 ms and the check
// 40-120 ms (2 shared cores), where loading the entries, every signature
// checked, took about 7 s.
func verify(path string) error {
	db, err := openBolt(path, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		return err
	}
	defer db.Close()
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("gossip: state store: %w", err)
	}
	err = guard(func() error {
		return db.View(func(tx *bolt.Tx) error {
			if tx.Size() > fi.Size() {
				return corrupt(path, "the file is %d bytes, its pages need %d: it was truncated", fi.Size(), tx.Size())
			}
			b := tx.Bucket(entriesBucket)
			if b == nil {
				// OpenStore makes the bucket right after bbolt makes the
				// file: only then is a file without it sound, and empty.
				if k, _ := tx.Cursor().First(); k != nil {
					return corrupt(path, "no entries bucket, but a key %.64q", k)
				}
				return nil
			}
			// Read here first, where a fault is caught: tx.Check reads
			// the same pages on a goroutine of its own.
			var prev []byte
			if err := b.ForEach(func(k, _ []byte) error {
				if prev != nil && bytes.Compare(prev, k) >= 0 {
					return corrupt(path, "keys out of order: %.64q after %.64q", k, prev)
				}
				prev = k
				return nil
			}); err != nil {
				return err
			}
			var found []string
			for err := range tx.Check() {
				if len(found) < 3 {
					found = append(found, err.Error())
				}
			}
			if len(found) > 0 {
				return corrupt(path, "%s", strings.Join(found, "; "))
			}
			return nil
		})
	}, path, nil)
	if err != nil && !errors.Is(err, ErrCorruptStore) {
		return fmt.Errorf("gossip: check state store %s: %w", path, err)
	}
	return err
}

// guard runs f, which reads the store at path, turning a panic or a
// memory fault into an error wrapping ErrCorruptStore: bbolt asserts on
// damaged pages, and reads where damaged offsets point. A panic for which
// callerPanicked (if not nil) reports true is the caller's own and goes on.
func guard(f func() error, path string, callerPanicked func() bool) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if callerPanicked != nil && callerPanicked() {
				panic(r)
			}
			err = corrupt(path, "%v", r)
		}
	}()
	return f()
}

// Path is the store's file.
func (s *Store) Path() string { return s.path }

// Load calls f with every stored envelope. Damage met on the way is an
// error wrapping ErrCorruptStore, not a panic.
func (s *Store) Load(f func(key string, raw []byte) error) error {
	inF := false
	err := guard(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			return tx.Bucket(entriesBucket).ForEach(func(k, v []byte) error {
				key, raw := string(k), append([]byte(nil), v...)
				inF = true
				err := f(key, raw)
				inF = false
				return err
			})
		})
	}, s.path, func() bool { return inF })
	return err
}

// Put stores entries in one transaction; it returns once they are on disk.
func (s *Store) Put(entries ...*Signed) error {
	if len(entries) == 0 {
		return nil
	}
	s.commits.Add(1)
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(entriesBucket)
		for _, e := range entries {
			if err := b.Put([]byte(e.Key), e.Raw); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("gossip: store entries: %w", err)
	}
	return nil
}

// Delete removes keys (collected tombstones).
func (s *Store) Delete(keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	s.commits.Add(1)
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(entriesBucket)
		for _, k := range keys {
			if err := b.Delete([]byte(k)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("gossip: delete entries: %w", err)
	}
	return nil
}

// Size is the store file's size in bytes.
func (s *Store) Size() (int64, error) {
	var n int64
	err := s.db.View(func(tx *bolt.Tx) error { n = tx.Size(); return nil })
	return n, err
}

// Check reports whether the store answers: a read transaction opens and
// finds the entries. It is cheap (no page is read past the root), for
// health checks.
func (s *Store) Check() error {
	err := s.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(entriesBucket) == nil {
			return errors.New("no entries bucket")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("gossip: state store %s: %w", s.path, err)
	}
	return nil
}

// Close closes the store.
func (s *Store) Close() error { return s.db.Close() }

// LoadState fills st from the store. An entry that does not open (bad
// bytes, bad signature) is corruption and an error; one the trust list no
// longer authorises, or whose value value (if set: ReplicaConfig.Value)
// refuses, is skipped and reported in skipped, since trust and the rules
// may change between runs, and so is a signed entry in bytes other than
// its own (ErrNotCanonical), which earlier versions took.
func LoadState(s *Store, st *State, value func(*Signed) error) (loaded, skipped int, err error) {
	err = s.Load(func(key string, raw []byte) error {
		e, err := Open(raw)
		if errors.Is(err, ErrNotCanonical) {
			skipped++ // another's copy an earlier version took (see Open)
			return nil
		}
		if err != nil {
			return corrupt(s.path, "key %q: %v", key, err)
		}
		if e.Key != key {
			return corrupt(s.path, "key %q holds an entry for %q", key, e.Key)
		}
		if value != nil && value(e) != nil {
			skipped++ // taken by an earlier version that did not check it
			return nil
		}
		if _, err := st.Apply(e, time.Time{}); err != nil {
			skipped++
			return nil
		}
		loaded++
		return nil
	})
	return loaded, skipped, err
}
