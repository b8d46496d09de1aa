package gossip

import "time"

// refusedVersions remembers, for a while, the versions of keys that pulls
// fetched and this node refused for a reason an honest peer can have
// (disagreement): a revoked node's memberships, a pending node's entries
// stored before this node refused them, a key kind of a newer version.
// The same goes for versions whose value the agent refuses
// (ReplicaConfig.Value: a node record that does not read, which an agent
// of an earlier version may hold).
// Honest peers keep holding them, so every digest comparison finds them
// again; without this memory each pull fetched and refused the same ones,
// and once more than maxDisagreements came first in a pull's order, every
// pull from every peer ended there and nothing after them was ever
// pulled. A version is remembered for refusedFor (its author may be
// admitted meanwhile, a trust list rolled out), at most maxRefused of
// them (past that the memory is emptied: it costs pulls only the work
// they did before it). Guarded by the replica's mu.
type refusedVersions struct {
	m map[uint64]refusal // by key hash
}

type refusal struct {
	vhash uint64
	until time.Time
}

const (
	refusedFor = 10 * time.Minute
	// valueRefusedFor is how long a version refused for its value
	// (ReplicaConfig.Value, which is pure) is remembered: it never
	// becomes acceptable, but a new version of the agent may judge it
	// otherwise after a restart, which forgets it anyway.
	valueRefusedFor = 24 * time.Hour
	maxRefused      = 1 << 16
)

// add remembers that the version vhash of the key hashed kh was refused
// at now, for d.
func (r *refusedVersions) add(kh, vhash uint64, now time.Time, d time.Duration) {
	if r.m == nil || len(r.m) >= maxRefused {
		r.m = map[uint64]refusal{}
	}
	r.m[kh] = refusal{vhash: vhash, until: now.Add(d)}
}

// has reports whether it is remembered at now.
func (r *refusedVersions) has(it ItemSummary, now time.Time) bool {
	f, ok := r.m[it.KeyHash]
	if !ok {
		return false
	}
	if f.vhash != it.VersionHash || !now.Before(f.until) {
		delete(r.m, it.KeyHash)
		return false
	}
	return true
}
