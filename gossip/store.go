package gossip

import (
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// StoreFile is the state store's file name inside the data dir.
const StoreFile = "state.db"

var entriesBucket = []byte("entries")

// ErrCorruptStore is returned when the store holds bytes that are not a
// valid entry. The store is never reset silently: the operator decides.
var ErrCorruptStore = errors.New("gossip: state store is corrupt")

// Store keeps the signed entries on disk (bbolt), key to envelope.
type Store struct {
	db   *bolt.DB
	path string
}

// OpenStore opens or creates the store at path. noSync skips fsync on
// commit: only for simulations, where durability is not under test.
func OpenStore(path string, noSync bool) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, NoSync: noSync})
	if err != nil {
		return nil, fmt.Errorf("gossip: open state store %s: %w (if it is damaged, move it aside: the node fetches the fleet's state again from its peers)", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(entriesBucket)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("gossip: state store %s: %w", path, err)
	}
	return &Store{db: db, path: path}, nil
}

// Path is the store's file.
func (s *Store) Path() string { return s.path }

// Load calls f with every stored envelope.
func (s *Store) Load(f func(key string, raw []byte) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(entriesBucket).ForEach(func(k, v []byte) error {
			return f(string(k), append([]byte(nil), v...))
		})
	})
}

// Put stores entries in one transaction; it returns once they are on disk.
func (s *Store) Put(entries ...*Signed) error {
	if len(entries) == 0 {
		return nil
	}
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

// Close closes the store.
func (s *Store) Close() error { return s.db.Close() }

// LoadState fills st from the store. An entry that does not open (bad
// bytes, bad signature) is corruption and an error; one the trust list no
// longer authorises is skipped and reported in skipped, since trust may
// change between runs.
func LoadState(s *Store, st *State) (loaded, skipped int, err error) {
	err = s.Load(func(key string, raw []byte) error {
		e, err := Open(raw)
		if err != nil {
			return fmt.Errorf("%w: %s: key %q: %v (move the file aside to refetch the state from peers)", ErrCorruptStore, s.path, key, err)
		}
		if e.Key != key {
			return fmt.Errorf("%w: %s: key %q holds an entry for %q", ErrCorruptStore, s.path, key, e.Key)
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
