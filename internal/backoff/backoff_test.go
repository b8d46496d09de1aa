package backoff

import (
	"testing"
	"time"
)

func TestWait(t *testing.T) {
	lo, hi := 500*time.Millisecond, time.Minute
	cases := []struct {
		failures int
		u        float64
		want     time.Duration
	}{
		{1, 0.5, 500 * time.Millisecond},
		{2, 0.5, time.Second},
		{3, 0.5, 2 * time.Second},
		{8, 0.5, time.Minute}, // 500ms·2^7 = 64s, capped at a minute
		{100, 0.5, time.Minute},
		{1, 0, 400 * time.Millisecond},    // -20%
		{100, 0.999999, 72 * time.Second}, // just under +20%
	}
	for _, tc := range cases {
		got := Wait(tc.failures, lo, hi, tc.u)
		if diff := got - tc.want; diff < -time.Millisecond || diff > time.Millisecond {
			t.Errorf("Wait(%d, u=%v) = %v, want %v", tc.failures, tc.u, got, tc.want)
		}
	}
}
