package tasks

import (
	"hash/fnv"
	"time"
)

// Next is when a member runs the task next: the first time after `after`
// that the schedule names, shifted by the member's splay offset (see
// SplayOffset), within the start/stop window, unless the member has made
// Count runs already. anchor is when the task was created: interval
// schedules without a start tick from it, so every member ticks together
// (splay aside) whenever it started. ok is false when the task never runs
// again on this member.
func (s Schedule) Next(after, anchor time.Time, runs int, offset time.Duration) (next time.Time, ok bool) {
	if s.Count > 0 && runs >= s.Count {
		return time.Time{}, false
	}
	// The base times are the schedule's own; a member fires offset after
	// each, so look for the first base time after after-offset.
	from := after.Add(-offset)
	if !s.Start.IsZero() && from.Before(s.Start) {
		from = s.Start.Add(-time.Nanosecond) // the start itself may fire
	}
	var base time.Time
	if s.Cron != "" {
		sched, err := parseCron(s.Cron)
		if err != nil { // Check refuses it; a bad entry never fires
			return time.Time{}, false
		}
		base = sched.Next(from)
		if base.IsZero() {
			return time.Time{}, false
		}
	} else {
		every := time.Duration(s.Interval)
		if every <= 0 {
			return time.Time{}, false
		}
		origin := anchor
		if !s.Start.IsZero() {
			origin = s.Start
		}
		// The first origin + k·every strictly after from.
		k := int64(0)
		if from.After(origin) || from.Equal(origin) {
			k = int64(from.Sub(origin)/every) + 1
		}
		base = origin.Add(time.Duration(k) * every)
	}
	if !base.After(from) {
		// Only a span past time.Duration's range gets here (Check
		// refuses such schedules): never a run at once, again and again.
		return time.Time{}, false
	}
	if !s.Stop.IsZero() && !base.Before(s.Stop) {
		return time.Time{}, false
	}
	return base.Add(offset), true
}

// SplayOffset is a member's share of the splay: a stable function of the
// member and the task, uniform over [0, splay), so a thousand members of a
// tribe spread their runs over the splay instead of firing together, and
// each member keeps its place from run to run.
func SplayOffset(splay Duration, member, task string) time.Duration {
	if splay <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(member))
	h.Write([]byte{0})
	h.Write([]byte(task))
	return time.Duration(h.Sum64() % uint64(splay))
}
