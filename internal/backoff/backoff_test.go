package backoff

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
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

// Loop tries a failing run again by itself, lo doubled per failure, and
// stops trying once it succeeds; a signal runs it at once.
func TestLoopTriesAgainUntilItSucceeds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		trigger := make(chan struct{}, 1)
		start := time.Now()
		var runs []time.Duration
		fails := 3
		done := make(chan struct{})
		go func() {
			defer close(done)
			Loop(ctx, trigger, time.Second, time.Minute, func() float64 { return 0.5 }, func() error {
				runs = append(runs, time.Since(start))
				if fails > 0 {
					fails--
					return errors.New("store refused")
				}
				return nil
			}, nil)
		}()
		trigger <- struct{}{}
		time.Sleep(time.Hour) // no signal: only its own tries
		// At 0, then 1 s, 2 s and 4 s after each failure; then nothing.
		want := []time.Duration{0, time.Second, 3 * time.Second, 7 * time.Second}
		if !slices.Equal(runs, want) {
			t.Fatalf("runs at %v, want %v", runs, want)
		}
		fails = 1
		trigger <- struct{}{} // fails: tries again a second later ...
		synctest.Wait()
		trigger <- struct{}{} // ... unless a signal comes first: it runs at once, and succeeds
		synctest.Wait()
		time.Sleep(time.Hour)
		if len(runs) != 6 || runs[4] != time.Hour || runs[5] != time.Hour {
			t.Fatalf("runs at %v: want two more at 1h, none after", runs)
		}
		cancel()
		<-done
	})
}
