package gossip

import "time"

// fetchStale is how long a pull's claim on an entry holds: a round answers
// in milliseconds, and a pull stuck on a slow peer (up to SyncTimeout)
// must not hold back the others for long.
const fetchStale = 5 * time.Second

// fetching is what this replica's pulls are fetching now. Pulls run at
// once (a node that joins pulls from each peer it meets as it meets them,
// and both ends of every new connection pull): each asked for everything
// it lacked, so a joiner fetched and checked the same entries from
// several peers. A pull now leaves out an entry another pull asked for
// (the same key at the same version) and did not get yet; if that pull
// fails, the entry is still missing at the next pull, which fetches it.
type fetching struct {
	by map[ItemSummary]fetchClaim
	// released is closed (and replaced) when a claim is released: pulls
	// that left entries to others wait on it (awaitShared).
	released chan struct{}
}

// releases is closed at the next release of a claim.
func (f *fetching) releases() <-chan struct{} {
	if f.released == nil {
		f.released = make(chan struct{})
	}
	return f.released
}

type fetchClaim struct {
	pull uint64
	at   time.Time
}

// claim reports whether pull may ask for it: no other pull claimed it in
// the last fetchStale. A claim made holds until release or fetchStale.
func (f *fetching) claim(pull uint64, it ItemSummary, now time.Time) bool {
	if c, ok := f.by[it]; ok && c.pull != pull && now.Sub(c.at) < fetchStale {
		return false
	}
	if f.by == nil {
		f.by = map[ItemSummary]fetchClaim{}
	}
	f.by[it] = fetchClaim{pull, now}
	return true
}

// release ends pull's claims on items (not another pull's that took one
// over).
func (f *fetching) release(pull uint64, items ...ItemSummary) {
	released := false
	for _, it := range items {
		if c, ok := f.by[it]; ok && c.pull == pull {
			delete(f.by, it)
			released = true
		}
	}
	if released && f.released != nil {
		close(f.released)
		f.released = nil
	}
}
