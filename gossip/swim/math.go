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

// probeHealthDelta is how a probe that got no direct ack moves the local
// health score (memberlist's awareness deltas): 0 for an ack through a
// helper; for a failed probe, one per helper whose nack did not come
// either (this node missed answers from members it takes for healthy:
// more likely its own fault than theirs), or 1 with no helpers. A direct
// ack moves it by ackHealthDelta.
func probeHealthDelta(indirect bool, helpers, nacks int) int {
	switch {
	case indirect:
		return 0
	case helpers == 0:
		return 1
	}
	return max(helpers-nacks, 0)
}

// ackHealthDelta is how a direct ack that came rtt after the ping moves
// the local health score, given the probe timeout configured (base) and
// as the score stretched it (stretched): +1 if it took more than half the
// stretched timeout, −1 (memberlist's) if it took at most half the base
// one, else nothing. Answers that slow mean a fleet (or this node) too
// busy to answer in time for long: each probe that fails next is a
// suspicion, its confirmations and a refutation for every node to check,
// more load on the busy fleet. So the timeout stretches until it is at
// least twice the answers' time (up to AwarenessMax times the base), and
// shrinks back once answers come as fast as the base timeout expects;
// between the two it holds, where shrinking at once would make the very
// next answer slow again.
func ackHealthDelta(rtt, base, stretched time.Duration) int {
	switch {
	case rtt > stretched/2:
		return 1
	case rtt <= base/2:
		return -1
	}
	return 0
}
