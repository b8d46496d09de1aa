package gossip

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/internal/names"
)

var (
	ErrUnknownKey   = errors.New("gossip: unknown key kind")
	ErrUnauthorized = errors.New("gossip: author may not write this key")
)

// Writer says who may write a key kind.
type Writer int

const (
	// Self: only the peer named in the key (at Kind.SelfSegment).
	Self Writer = iota + 1
	// Trusted: any trusted writer (see Trust).
	Trusted
)

// Kind is one row of the authorisation table. Pattern segments in braces
// are placeholders: {peer} must be a peer ID, any other a name.
type Kind struct {
	Name        string
	Pattern     string
	Writer      Writer
	SelfSegment int // index of the {peer} segment for Self
	// Direct kinds travel from their author to the trusted writers, not
	// by fleet-wide anti-entropy (see Scope and DirectKey).
	Direct bool
	// Collected kinds' tombstones are dropped after TombstoneGrace (see
	// State.Collect). The others' are kept as long as the state: a
	// deletion there withdraws authority (a membership granted by hand, a
	// plugin loaded, a policy, a task, an admission), and the entry it
	// deleted, signed by a trusted writer and kept by anyone who saw it,
	// would be taken again if replayed once its tombstone was gone. A
	// kind may be collected only where such a replay restores nothing:
	// say why on its row.
	Collected bool
	// MaxPerAuthor, if not zero, bounds the keys of this kind held per
	// author, tombstones included (see Replica's checkPerAuthor): a kind
	// whose keys a node names itself (a tribe's name) would otherwise let
	// one node that counts have every node hold as many as it liked.
	MaxPerAuthor int
}

// MaxPolicyMemberships bounds the tribes a node is in by policy, as far
// as others hold: one membership key per tribe, tombstones included
// (those of the last TombstoneGrace). A node in more tribes than this
// by policy has the rest refused, its own write included, with
// ErrAuthorFull.
const MaxPolicyMemberships = 1024

// Kinds is the whole authorisation table, deny by default: a key that
// matches no row is refused. Every row is tested (auth_test.go).
var Kinds = []Kind{
	// Self kinds are collected: their author could write a replayed entry
	// anew anyway, and an agent takes back what a replay says of it (see
	// node's reconcile).
	{Name: "node", Pattern: "nodes/{peer}", Writer: Self, SelfSegment: 1, Collected: true},
	// admitted/<peer>: a trusted writer admitted (or revoked) the peer;
	// see package authority for what that grants.
	{Name: "admission", Pattern: "admitted/{peer}", Writer: Trusted},
	{Name: "tribe", Pattern: "tribes/{tribe}", Writer: Trusted},
	{Name: "member-manual", Pattern: "tribes/{tribe}/members/{peer}/manual", Writer: Trusted},
	{Name: "member-policy", Pattern: "tribes/{tribe}/members/{peer}/policy", Writer: Self, SelfSegment: 3, Collected: true, MaxPerAuthor: MaxPolicyMemberships},
	{Name: "policy", Pattern: "policies/{policy}", Writer: Trusted},
	{Name: "plugin", Pattern: "tribes/{tribe}/plugins/{plugin}", Writer: Trusted},
	{Name: "task", Pattern: "tribes/{tribe}/tasks/{task}", Writer: Trusted},
	// forced/<peer>: a trusted writer force-left the peer (`tribe
	// force-leave`): every node treats it as left and reaped until it
	// writes a newer record.
	{Name: "forced", Pattern: "forced/{peer}", Writer: Trusted},
	// jobs/<id>: a durable job (package plugins/jobs), written by a trusted
	// writer; jobs/<id>/acks/<peer>: where it stands on that target,
	// written by the target alone, for the job's writer (direct). A job is
	// collected: it is deleted only after it expired (jobs.CollectAt), and
	// a replayed job past its expiry is only acked expired.
	{Name: "job", Pattern: "jobs/{job}", Writer: Trusted, Collected: true},
	{Name: "job-ack", Pattern: "jobs/{job}/acks/{peer}", Writer: Self, SelfSegment: 3, Direct: true, Collected: true},
}

// DirectKey reports whether key is of a direct kind (see Scope): the
// rule ReplicaConfig.Direct takes in an agent. The state asks at every
// entry it applies: a key whose first segment starts no direct kind is
// answered without classifying it.
func DirectKey(key string) bool {
	first, _, _ := strings.Cut(key, "/")
	if !directFirst[first] {
		return false
	}
	k, _, err := classify(key)
	return err == nil && k.Direct
}

// directFirst are the first segments of the direct kinds' patterns.
var directFirst = func() map[string]bool {
	m := map[string]bool{}
	for _, k := range Kinds {
		if k.Direct {
			first, _, _ := strings.Cut(k.Pattern, "/")
			m[first] = true
		}
	}
	return m
}()

// boundedFirst are the first segments of the patterns of kinds bounded
// per author (Kind.MaxPerAuthor): the state classifies a new key only if
// it starts with one.
var boundedFirst = func() map[string]bool {
	m := map[string]bool{}
	for _, k := range Kinds {
		if k.MaxPerAuthor > 0 {
			first, _, _ := strings.Cut(k.Pattern, "/")
			m[first] = true
		}
	}
	return m
}()

// bounded returns key's kind if it is bounded per author.
func bounded(key string) (Kind, bool) {
	first, _, _ := strings.Cut(key, "/")
	if !boundedFirst[first] {
		return Kind{}, false
	}
	k, err := Classify(key)
	return k, err == nil && k.MaxPerAuthor > 0
}

// ValidName reports whether s may name a tribe, policy, plugin or task.
func ValidName(s string) bool { return names.Valid(s) }

// kindSegs holds each row's pattern split at "/", once.
var kindSegs = func() [][]string {
	out := make([][]string, len(Kinds))
	for i, k := range Kinds {
		out[i] = strings.Split(k.Pattern, "/")
	}
	return out
}()

// Classify returns the kind of key, or ErrUnknownKey.
func Classify(key string) (Kind, error) {
	k, _, err := classify(key)
	return k, err
}

// classify is Classify that also returns the key's segments.
func classify(key string) (Kind, []string, error) {
	segs := strings.Split(key, "/")
	for i, pattern := range kindSegs {
		if matches(pattern, segs) {
			return Kinds[i], segs, nil
		}
	}
	return Kind{}, nil, fmt.Errorf("%w: %q", ErrUnknownKey, key)
}

// matches compares the literal segments first and checks placeholders
// only when they all agree: decoding a peer ID costs more than the rest.
func matches(pattern, segs []string) bool {
	if len(pattern) != len(segs) {
		return false
	}
	for i, p := range pattern {
		if !strings.HasPrefix(p, "{") && p != segs[i] {
			return false
		}
	}
	for i, p := range pattern {
		switch {
		case p == "{peer}":
			if _, ok := canonicalPeer(segs[i]); !ok {
				return false
			}
		case strings.HasPrefix(p, "{"):
			if !ValidName(segs[i]) {
				return false
			}
		}
	}
	return true
}

// canonicalPeer decodes s if it is a peer ID in its canonical form, as
// peer.ID.String writes it (base58): one peer, one key (another encoding
// of the same ID would be a second key for the same node). peer.Decode
// reads base58 for these prefixes and a CID for any other; base58
// decoding is one to one, so a base58 string that decodes is the only
// encoding of its ID, and is not written back to compare (that was a
// third of what checking an entry's key cost, at every entry).
func canonicalPeer(s string) (peer.ID, bool) {
	if !strings.HasPrefix(s, "Qm") && !strings.HasPrefix(s, "1") {
		return "", false
	}
	if id, ok := peerIDs.get(s); ok {
		return id, true
	}
	id, err := peer.Decode(s)
	if err != nil {
		return "", false
	}
	peerIDs.put(s, id)
	return id, true
}

// peerIDs remembers the strings canonicalPeer accepted: the same node IDs
// come back in key after key (a job's acks, tribe members, node records),
// and decoding one cost ~4 µs (2.5% of the CPU a job costs its writer and
// targets). It holds only IDs that decoded, at most peerIDsMax (emptied
// when full): what a peer can make it hold, it could make a node decode
// anyway.
var peerIDs = &peerIDCache{}

// peerIDsMax covers a fleet of 5,000 and its churn.
const peerIDsMax = 16384

type peerIDCache struct {
	mu sync.Mutex
	m  map[string]peer.ID
}

func (c *peerIDCache) get(s string) (peer.ID, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := c.m[s]
	return id, ok
}

func (c *peerIDCache) put(s string, id peer.ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= peerIDsMax {
		c.m = make(map[string]peer.ID, 64)
	}
	c.m[strings.Clone(s)] = id // s is often a piece of a longer key
}

// Trust decides who the trusted writers are. An empty list trusts every
// peer that could connect (the fleet is then as open as its network: use a
// swarm key or a trust list).
type Trust struct {
	list map[peer.ID]bool
}

// NewTrust makes a trust list; no peers means everyone is trusted.
func NewTrust(peers ...peer.ID) Trust {
	t := Trust{list: map[peer.ID]bool{}}
	for _, p := range peers {
		t.list[p] = true
	}
	return t
}

// Open reports whether every peer is trusted.
func (t Trust) Open() bool { return len(t.list) == 0 }

// Trusted reports whether p is a trusted writer.
func (t Trust) Trusted(p peer.ID) bool { return t.Open() || t.list[p] }

// Peers lists the trusted writers (none when open).
func (t Trust) Peers() []peer.ID {
	out := make([]peer.ID, 0, len(t.list))
	for p := range t.list {
		out = append(out, p)
	}
	return out
}

// Authorize checks that author may write key.
func (t Trust) Authorize(key string, author peer.ID) error {
	k, segs, err := classify(key)
	if err != nil {
		return err
	}
	switch k.Writer {
	case Self:
		if id, _ := canonicalPeer(segs[k.SelfSegment]); id == author {
			return nil
		}
		return fmt.Errorf("%w: %s may be written only by the peer it names, not %s", ErrUnauthorized, key, author)
	case Trusted:
		if t.Trusted(author) {
			return nil
		}
		return fmt.Errorf("%w: %s needs a trusted writer, %s is not one", ErrUnauthorized, key, author)
	}
	return fmt.Errorf("%w: kind %s has no writer rule", ErrUnauthorized, k.Name)
}
