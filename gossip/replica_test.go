package gossip

import (
	"slices"
	"testing"
)

func TestDrain(t *testing.T) {
	for _, tc := range []struct {
		name    string
		queued  []int
		closed  bool
		max     int
		want    []int
		remains int
	}{
		{"nothing queued", nil, false, 4, []int{0}, 0},
		{"all of a short queue", []int{1, 2}, false, 4, []int{0, 1, 2}, 0},
		{"up to max", []int{1, 2, 3, 4, 5}, false, 3, []int{0, 1, 2}, 3},
		{"stops at close", []int{1}, true, 4, []int{0, 1}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := make(chan int, 8)
			for _, v := range tc.queued {
				ch <- v
			}
			if tc.closed {
				close(ch)
			}
			got := drain(ch, []int{0}, tc.max)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("drain = %v, want %v", got, tc.want)
			}
			if len(ch) != tc.remains {
				t.Fatalf("%d left queued, want %d", len(ch), tc.remains)
			}
		})
	}
}
