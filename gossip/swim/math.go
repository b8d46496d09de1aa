package swim

import (
	"math"
	"time"
)

// suspicionMin is the shortest a suspicion lasts among n members:
// memberlist's suspicionTimeout, mult × max(1, log10 n) × interval. It
// grows with the fleet because a change takes about log n rounds to
// reach everyone, and the suspect must hear of it in time to refute.
func suspicionMin(mult, n int, interval time.Duration) time.Duration {
	scale := max(1, math.Log10(float64(max(n, 1))))
	return time.Duration(float64(mult) * scale * float64(interval))
}

// suspicionLeft is how long a suspicion that started elapsed ago has
// still to run, with c independent confirmations of the k expected:
// Lifeguard's timeout, max − (max − min) × log(c+1)/log(k+1), never below
// min, then less what has elapsed (never below zero). A lone accuser, who
// may be the one with the bad network, waits longest.
func suspicionLeft(c, k int, elapsed, lo, hi time.Duration) time.Duration {
	timeout := hi
	if k > 0 {
		frac := math.Log(float64(c)+1) / math.Log(float64(k)+1)
		timeout = max(lo, hi-time.Duration(frac*float64(hi-lo)))
	}
	timeout = timeout.Truncate(time.Millisecond)
	return max(0, timeout-elapsed)
}

// retransmits is how many times a change is sent among n members:
// mult × ceil(log10(n+1)), enough for an epidemic to reach all with high
// probability.
func retransmits(mult, n int) int {
	return mult * int(math.Ceil(math.Log10(float64(n)+1)))
}

// probeHealthDelta is how a probe moves the local health score
// (memberlist's awareness deltas): −1 for a direct ack; 0 for an ack
// through a helper; for a failed probe, one per helper whose nack did
// not come either (this node missed answers from members it takes for
// healthy: more likely its own fault than theirs), or 1 with no helpers.
func probeHealthDelta(direct, indirect bool, helpers, nacks int) int {
	switch {
	case direct:
		return -1
	case indirect:
		return 0
	case helpers == 0:
		return 1
	}
	return max(helpers-nacks, 0)
}
