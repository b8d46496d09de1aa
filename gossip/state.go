package gossip

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/btree"
	"github.com/libp2p/go-libp2p/core/peer"
)

// MaxClockSkew is how far in the future an entry's clock may be, against
// the receiver's wall clock, before the entry is refused.
const MaxClockSkew = time.Minute

// TombstoneGrace is how long a deletion of a collected kind (Kind.Collected)
// is kept before Collect drops it. A replica that was away longer than this
// may bring such a deleted key back; collecting sooner would make that
// likelier, later costs memory.
const TombstoneGrace = 7 * 24 * time.Hour

// Change is what an Apply did to one key: Old is the version replaced (nil
// if the key was new), New the version now held.
type Change struct {
	Key string
	Old *Signed
	New *Signed
}

// State is the pure core of the replicated map: a last-writer-wins map of
// signed entries with a digest for anti-entropy. It does no I/O, starts no
// goroutines and reads no clock: time comes in as arguments. It is not safe
// for concurrent use; the Replica guards it.
type State struct {
	trust   Trust
	entries map[string]*Signed
	keys    *btree.BTreeG[string] // the keys of entries, in order, for Prefix
	// shared and direct are the digests of the shared and the direct
	// entries (see Scope); isDirect says which a key is.
	shared, direct digest
	isDirect       func(key string) bool
	// perAuthor counts the keys held, tombstones included, of each
	// author in the kinds bounded per author (Kind.MaxPerAuthor).
	perAuthor map[authorKind]int
}

// authorKind names one author's keys of one kind.
type authorKind struct {
	kind   string
	author peer.ID
}

// NewState returns an empty state that authorises entries with trust.
func NewState(trust Trust) *State {
	return &State{trust: trust, entries: map[string]*Signed{}, keys: btree.NewOrderedG[string](keysDegree), perAuthor: map[authorKind]int{}}
}

// keysDegree is the key index's B-tree degree: google/btree's examples
// use 32 for in-memory trees (nodes of up to 63 keys).
const keysDegree = 32

// Trust is the state's trust list.
func (s *State) Trust() Trust { return s.trust }

// Check validates an opened entry for this state: authorised author, and
// (when now is not zero) a clock no more than MaxClockSkew ahead of now.
func (s *State) Check(e *Signed, now time.Time) error { return s.trust.Check(e, now) }

// Check validates an opened entry against this trust list: authorised
// author, and (when now is not zero) a clock no more than MaxClockSkew
// ahead of now.
func (t Trust) Check(e *Signed, now time.Time) error {
	if err := t.Authorize(e.Key, e.Author); err != nil {
		return err
	}
	if !now.IsZero() && e.HLC.Wall().After(now.Add(MaxClockSkew)) {
		return fmt.Errorf("%w: %s is %v ahead", ErrFromFuture, e.Key, e.HLC.Wall().Sub(now).Round(time.Second))
	}
	return nil
}

// Apply checks e and merges it: it replaces the held version of its key if
// it is newer by (HLC, author). The returned change is nil when e was old
// or a duplicate. A refused entry changes nothing.
func (s *State) Apply(e *Signed, now time.Time) (*Change, error) {
	if err := s.Check(e, now); err != nil {
		return nil, err
	}
	old := s.entries[e.Key]
	if old != nil && !e.newer(old) {
		return nil, nil
	}
	s.entries[e.Key] = e
	if old == nil {
		s.keys.ReplaceOrInsert(e.Key)
		s.countAuthor(e, 1)
	}
	s.digestOf(e.Key).put(e.Key, keyHash(e.Key), versionHash(e))
	return &Change{Key: e.Key, Old: old, New: e}, nil
}

// Get returns the live (not deleted) entry under key.
func (s *State) Get(key string) (*Signed, bool) {
	e, ok := s.entries[key]
	if !ok || e.Deleted {
		return nil, false
	}
	return e, true
}

// Version returns whatever version is held for key, tombstones included.
func (s *State) Version(key string) (*Signed, bool) {
	e, ok := s.entries[key]
	return e, ok
}

// Prefix returns the live entries whose key starts with prefix, by key.
// It walks only those keys: the job loop and status read a job's entries
// at every change, in a state that holds thousands of other keys.
func (s *State) Prefix(prefix string) []*Signed { return s.prefix(prefix, false) }

// PrefixAll is Prefix with tombstones.
func (s *State) PrefixAll(prefix string) []*Signed { return s.prefix(prefix, true) }

func (s *State) prefix(prefix string, tombstones bool) []*Signed {
	var out []*Signed
	s.keys.AscendGreaterOrEqual(prefix, func(k string) bool {
		if !strings.HasPrefix(k, prefix) {
			return false
		}
		if e := s.entries[k]; tombstones || !e.Deleted {
			out = append(out, e)
		}
		return true
	})
	return out
}

// Children returns the live entries whose key is prefix and one more
// segment (no further '/'), by key, skipping what lies below each: the
// jobs of jobs/, not their acks. prefix should end in '/'.
func (s *State) Children(prefix string) []*Signed {
	var out []*Signed
	s.eachChild(prefix, func(k, _ string, below bool) {
		if e := s.entries[k]; !below && !e.Deleted {
			out = append(out, e)
		}
	})
	return out
}

// Segments returns, by key, the distinct segments that follow prefix in
// the keys held (live or not), walking one key of each subtree: the ids
// of jobs/ whatever is left of each job (its entry, its acks), without
// reading every ack. prefix should end in '/'.
func (s *State) Segments(prefix string) []string {
	var out []string
	seen := map[string]bool{}
	s.eachChild(prefix, func(_, seg string, _ bool) {
		if !seen[seg] {
			seen[seg] = true
			out = append(out, seg)
		}
	})
	slices.Sort(out) // "a/x" comes after "a-b" and "a.c": a subtree may follow later keys
	return out
}

// eachChild calls f, in key order, with each key held one segment below
// prefix, its segment, and whether the key lies below the segment: of
// such a subtree f sees the first key only, the rest is skipped.
func (s *State) eachChild(prefix string, f func(k, seg string, below bool)) {
	from := prefix
	for from != "" {
		next := ""
		s.keys.AscendGreaterOrEqual(from, func(k string) bool {
			if !strings.HasPrefix(k, prefix) {
				return false
			}
			seg, _, below := strings.Cut(k[len(prefix):], "/")
			f(k, seg, below)
			if below {
				// Past this subtree: '0' is the byte after '/'.
				next = prefix + seg + "0"
				return false
			}
			return true
		})
		from = next
	}
}

// forget drops key, whatever its version, and returns what was held.
func (s *State) forget(key string) *Signed {
	e := s.entries[key]
	if e != nil {
		delete(s.entries, key)
		s.keys.Delete(key)
		s.digestOf(key).remove(keyHash(key))
		s.countAuthor(e, -1)
	}
	return e
}

// countAuthor adds d to the count of e's author's keys of e's kind, if
// that kind is bounded per author.
func (s *State) countAuthor(e *Signed, d int) {
	k, ok := bounded(e.Key)
	if !ok {
		return
	}
	ak := authorKind{k.Name, e.Author}
	if s.perAuthor[ak] += d; s.perAuthor[ak] <= 0 {
		delete(s.perAuthor, ak)
	}
}

// AuthorHolds is how many keys of kind by author are held, tombstones
// included; counted for the kinds bounded per author (Kind.MaxPerAuthor)
// only.
func (s *State) AuthorHolds(kind string, author peer.ID) int {
	return s.perAuthor[authorKind{kind, author}]
}

// Len is the number of keys held, tombstones included.
func (s *State) Len() int { return len(s.entries) }

// MaxHLC is the highest clock among the held entries.
func (s *State) MaxHLC() HLC {
	var m HLC
	for _, e := range s.entries {
		m = max(m, e.HLC)
	}
	return m
}

// Collect drops the tombstones of collected kinds (Kind.Collected) older
// than grace at now and returns their keys. The others are kept: dropping
// one would let a replay of the trusted writer's entry it deleted restore
// what the deletion withdrew.
func (s *State) Collect(now time.Time, grace time.Duration) []string {
	var gone []string
	for k, e := range s.entries {
		if e.Deleted && now.Sub(e.HLC.Wall()) > grace && collected(k) {
			s.forget(k)
			gone = append(gone, k)
		}
	}
	slices.Sort(gone)
	return gone
}

// collected reports whether key's tombstones may be collected: those of
// collected kinds, and those of keys no kind names (a row taken out of the
// table in a newer version), which nothing would take again.
func collected(key string) bool {
	k, err := Classify(key)
	return err != nil || k.Collected
}

// Hash is a strong hash of the whole state (every key's exact version):
// equal on two replicas exactly when they hold the same versions.
func (s *State) Hash() [32]byte {
	keys := make([]string, 0, len(s.entries))
	for k := range s.entries {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h := sha256.New()
	var n [8]byte
	for _, k := range keys {
		binary.BigEndian.PutUint64(n[:], uint64(len(k)))
		h.Write(n[:])
		h.Write([]byte(k))
		e := s.entries[k]
		h.Write(e.Hash[:])
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// Root is the digest's root hash: cheap, and equal on replicas holding the
// same versions (up to 64-bit collisions).
func (s *State) Root() uint64 {
	h, _ := s.view(Full).hash(NodeRef{})
	return h
}

// byKeyHash returns the held entry whose key hashes to khash.
func (s *State) byKeyHash(khash uint64) (*Signed, bool) {
	key, _, ok := s.view(Full).lookup(khash)
	if !ok {
		return nil, false
	}
	return s.entries[key], true
}
