package swim

import (
	"testing"
	"time"
)

func TestSuspicionMin(t *testing.T) {
	for _, c := range []struct {
		mult, n int
		want    time.Duration
	}{
		{4, 0, 4 * time.Second}, // log10 below 1 counts as 1
		{4, 1, 4 * time.Second},
		{4, 10, 4 * time.Second},
		{4, 100, 8 * time.Second},
		{4, 1000, 12 * time.Second},
		{4, 5000, 14796 * time.Millisecond},
		{1, 100, 2 * time.Second},
	} {
		if got := suspicionMin(c.mult, c.n, time.Second).Round(time.Millisecond); got != c.want {
			t.Errorf("suspicionMin(%d, %d, 1s) = %v, want %v", c.mult, c.n, got, c.want)
		}
	}
}

func TestSuspicionLeft(t *testing.T) {
	const lo, hi = 2 * time.Second, 30 * time.Second
	for _, c := range []struct {
		c, k    int
		elapsed time.Duration
		want    time.Duration
	}{
		{0, 3, 0, hi},               // a lone accuser waits longest
		{1, 3, 0, 16 * time.Second}, // log 2 / log 4 = 1/2 of the way down
		{3, 3, 0, lo},               // all expected confirmations: the minimum
		{9, 3, 0, lo},               // more never goes below it
		{0, 3, 10 * time.Second, 20 * time.Second},
		{1, 3, 20 * time.Second, 0},                 // past its (shrunk) timeout
		{0, 0, 5 * time.Second, hi - 5*time.Second}, // nobody to confirm: the maximum
		{2, 3, 0, 7810 * time.Millisecond},          // 30 s − 28 s × log 3 / log 4
	} {
		if got := suspicionLeft(c.c, c.k, c.elapsed, lo, hi); got != c.want {
			t.Errorf("suspicionLeft(%d, %d, %v) = %v, want %v", c.c, c.k, c.elapsed, got, c.want)
		}
	}
}

func TestRetransmits(t *testing.T) {
	for _, c := range []struct{ mult, n, want int }{
		{4, 1, 4}, {4, 9, 4}, {4, 10, 8}, {4, 99, 8}, {4, 100, 12}, {4, 1000, 16}, {4, 5000, 16}, {3, 10000, 15},
	} {
		if got := retransmits(c.mult, c.n); got != c.want {
			t.Errorf("retransmits(%d, %d) = %d, want %d", c.mult, c.n, got, c.want)
		}
	}
}

func TestProbeHealthDelta(t *testing.T) {
	for _, c := range []struct {
		name           string
		indirect       bool
		helpers, nacks int
		want           int
	}{
		{"ack through a helper", true, 3, 1, 0},
		{"failed, no helpers to ask", false, 0, 0, 1},
		{"failed, every helper nacked: the target is down, not us", false, 3, 3, 0},
		{"failed, one nack of three missing", false, 3, 2, 1},
		{"failed, no helper answered at all: likely us", false, 3, 0, 3},
	} {
		if got := probeHealthDelta(c.indirect, c.helpers, c.nacks); got != c.want {
			t.Errorf("%s: probeHealthDelta = %d, want %d", c.name, got, c.want)
		}
	}
}

func TestAckHealthDelta(t *testing.T) {
	const base = 500 * time.Millisecond
	for _, c := range []struct {
		rtt, stretched time.Duration
		want           int
	}{
		{time.Millisecond, base, -1},
		{base / 2, base, -1},
		{base/2 + time.Millisecond, base, 1},
		{base, base, 1},
		{base/2 + time.Millisecond, 2 * base, 0}, // stretched once: holds
		{base, 2 * base, 0},
		{base + time.Millisecond, 2 * base, 1},
		{base / 2, 4 * base, -1}, // as fast as the base expects: shrinks
	} {
		if got := ackHealthDelta(c.rtt, base, c.stretched); got != c.want {
			t.Errorf("ackHealthDelta(%v, %v, %v) = %d, want %d", c.rtt, base, c.stretched, got, c.want)
		}
	}
}
