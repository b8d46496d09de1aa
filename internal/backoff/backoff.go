// Package backoff is the wait before a retry, shared by everything in the
// agent that tries again: --join dials, a call whose dial timed out, the
// policy memberships a node writes (Loop).
package backoff

import (
	"context"
	"time"
)

// Wait is the wait before retry number failures (1 for the first retry):
// lo doubled per failure, capped at hi, then spread by ±20% with u drawn
// uniformly from [0, 1), so that what failed together (a fleet restarted
// at once, a fan-out's dials) does not try again in step.
func Wait(failures int, lo, hi time.Duration, u float64) time.Duration {
	d := lo
	for i := 1; i < failures && d < hi; i++ {
		d *= 2
	}
	return time.Duration(float64(min(d, hi)) * (0.8 + 0.4*u))
}

// Loop runs run at each signal on trigger until ctx ends and, while run
// fails, again by itself after Wait(failures, lo, hi, rnd()): what a
// failure left undone (a write the store refused) is done once the cause
// passes, not only at the next signal, which may never come. A signal
// that comes meanwhile runs it at once; a success resets the count.
// failed, if set, hears each failure and the wait before the next try.
func Loop(ctx context.Context, trigger <-chan struct{}, lo, hi time.Duration, rnd func() float64,
	run func() error, failed func(err error, wait time.Duration)) {
	var retry *time.Timer
	var again <-chan time.Time
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-trigger:
		case <-again:
		}
		if retry != nil {
			retry.Stop()
			retry, again = nil, nil
		}
		err := run()
		if err == nil || ctx.Err() != nil {
			failures = 0
			continue
		}
		failures++
		wait := Wait(failures, lo, hi, rnd())
		if failed != nil {
			failed(err, wait)
		}
		retry = time.NewTimer(wait)
		again = retry.C
	}
}
