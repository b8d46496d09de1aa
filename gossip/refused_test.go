package gossip

import (
	"testing"
	"time"
)

// A refused version is remembered for refusedFor, only that version, and
// the memory empties itself when full.
func TestRefusedVersions(t *testing.T) {
	var r refusedVersions
	r.add(1, 10, t0, refusedFor)
	for _, c := range []struct {
		it   ItemSummary
		at   time.Duration
		want bool
	}{
		{ItemSummary{KeyHash: 1, VersionHash: 10}, refusedFor - time.Second, true},
		{ItemSummary{KeyHash: 2, VersionHash: 10}, 0, false},
		{ItemSummary{KeyHash: 1, VersionHash: 11}, 0, false}, // another version: asked for
		{ItemSummary{KeyHash: 1, VersionHash: 10}, 0, false}, // forgotten with it
	} {
		if got := r.has(c.it, t0.Add(c.at)); got != c.want {
			t.Errorf("%+v at +%v: %v, want %v", c.it, c.at, got, c.want)
		}
	}
	r.add(1, 10, t0, refusedFor)
	if r.has(ItemSummary{KeyHash: 1, VersionHash: 10}, t0.Add(refusedFor)) {
		t.Error("remembered past refusedFor")
	}
	for i := range maxRefused + 1 {
		r.add(uint64(i), 1, t0, refusedFor)
	}
	if len(r.m) > maxRefused {
		t.Errorf("%d remembered, at most %d", len(r.m), maxRefused)
	}
}
