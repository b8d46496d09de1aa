// Package backoff is the wait before a retry, shared by everything in the
// agent that tries again: --join dials, a call whose dial timed out.
package backoff

import "time"

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
