package node

import (
	"math"
	"testing"
)

// TestAdvertiseChance: every node of a small fleet advertises, about
// advertisers nodes of a large one, whatever its size.
func TestAdvertiseChance(t *testing.T) {
	for _, n := range []int{0, 1, 2, advertisers} {
		if got := advertiseChance(n); got != 1 {
			t.Errorf("advertiseChance(%d) = %v, want 1", n, got)
		}
	}
	for _, n := range []int{advertisers + 1, 50, 1000, 5000} {
		got := advertiseChance(n)
		if got <= 0 || got >= 1 || math.Abs(got*float64(n)-advertisers) > 1e-9 {
			t.Errorf("advertiseChance(%d) = %v: %v advertisers a round, want %d", n, got, got*float64(n), advertisers)
		}
	}
}
