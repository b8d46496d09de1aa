package gossip

import "slices"

// Scope is what a pull compares: every entry, or the entries every node
// keeps. Direct keys (State.SetDirect: a job's acks) travel from their
// author to the trusted writers, straight or when a writer asks for them,
// not by fleet-wide anti-entropy: with every ack of every job on every
// node, a job to N targets cost each node N signature checks and N
// entries of state, the fleet N².
type Scope uint8

const (
	// Full compares every entry: between trusted writers, and in a
	// cluster without a trust list (any node may then write a job).
	Full Scope = iota
	// Shared leaves the direct keys out: between any two nodes that are
	// not both trusted writers.
	Shared
)

func (sc Scope) String() string {
	if sc == Shared {
		return "shared"
	}
	return "full"
}

// view is the digest a scope compares: the shared entries' digest and,
// for Full, the direct entries' as well. The two are disjoint, so a
// node's hash in Full is the XOR of both.
type view struct{ shared, direct *digest }

func (s *State) view(sc Scope) view {
	v := view{shared: &s.shared}
	if sc == Full {
		v.direct = &s.direct
	}
	return v
}

func (v view) hash(n NodeRef) (h uint64, count int) {
	h, count = v.shared.hash(n)
	if v.direct != nil {
		dh, dc := v.direct.hash(n)
		h, count = h^dh, count+dc
	}
	return h, count
}

// items calls f for every item under n, in key-hash order.
func (v view) items(n NodeRef, f func(digestItem)) {
	if v.direct == nil {
		v.shared.items(n, f)
		return
	}
	if _, dc := v.direct.hash(n); dc == 0 {
		v.shared.items(n, f)
		return
	}
	var all []digestItem
	add := func(it digestItem) { all = append(all, it) }
	v.shared.items(n, add)
	v.direct.items(n, add)
	slices.SortFunc(all, func(a, b digestItem) int { return cmpItem(a, b.khash) })
	for _, it := range all {
		f(it)
	}
}

func (v view) lookup(khash uint64) (string, uint64, bool) {
	if key, vh, ok := v.shared.lookup(khash); ok || v.direct == nil {
		return key, vh, ok
	}
	return v.direct.lookup(khash)
}

// SetDirect sets which keys are direct (see Scope); nil makes none. Set
// it before any entry is applied: the digests are not rebuilt.
func (s *State) SetDirect(direct func(key string) bool) { s.isDirect = direct }

// digestOf is the digest that holds key.
func (s *State) digestOf(key string) *digest {
	if s.isDirect != nil && s.isDirect(key) {
		return &s.direct
	}
	return &s.shared
}
