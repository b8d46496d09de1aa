package tasks

import (
	"testing"
	"time"
)

func TestScheduleNext(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for _, c := range []struct {
		name   string
		s      Schedule
		after  time.Time
		runs   int
		offset time.Duration
		want   time.Time // zero: never again
	}{
		{"interval ticks from the anchor", Schedule{Interval: Duration(10 * time.Second)}, at(25 * time.Second), 0, 0, at(30 * time.Second)},
		{"a tick is strictly after", Schedule{Interval: Duration(10 * time.Second)}, at(30 * time.Second), 0, 0, at(40 * time.Second)},
		{"before the anchor, the anchor", Schedule{Interval: Duration(10 * time.Second)}, at(-time.Hour), 0, 0, t0},
		{"splay shifts every tick", Schedule{Interval: Duration(10 * time.Second)}, at(25 * time.Second), 0, 3 * time.Second, at(33 * time.Second)},
		{"splay: a tick passed by its offset is next", Schedule{Interval: Duration(10 * time.Second)}, at(32 * time.Second), 0, 3 * time.Second, at(33 * time.Second)},
		{"start anchors the interval", Schedule{Interval: Duration(time.Minute), Start: at(90 * time.Second)}, at(0), 0, 0, at(90 * time.Second)},
		{"after start, start + k·interval", Schedule{Interval: Duration(time.Minute), Start: at(90 * time.Second)}, at(100 * time.Second), 0, 0, at(150 * time.Second)},
		{"stop ends it", Schedule{Interval: Duration(time.Minute), Stop: at(2 * time.Minute)}, at(time.Minute), 0, 0, time.Time{}},
		{"just before stop", Schedule{Interval: Duration(time.Minute), Stop: at(2*time.Minute + 1)}, at(time.Minute), 0, 0, at(2 * time.Minute)},
		{"count reached", Schedule{Interval: Duration(time.Second), Count: 3}, at(0), 3, 0, time.Time{}},
		{"count not reached", Schedule{Interval: Duration(time.Second), Count: 3}, at(0), 2, 0, at(time.Second)},
		{"cron every five minutes", Schedule{Cron: "*/5 * * * *"}, at(7 * time.Minute), 0, 0, at(10 * time.Minute)},
		{"cron is in UTC", Schedule{Cron: "0 12 * * *"}, at(0), 0, 0, at(2 * time.Hour)},
		{"cron with splay", Schedule{Cron: "*/5 * * * *"}, at(7 * time.Minute), 0, 30 * time.Second, at(10*time.Minute + 30*time.Second)},
		{"cron waits for start", Schedule{Cron: "@hourly", Start: at(3 * time.Hour)}, at(0), 0, 0, at(3 * time.Hour)},
		// A span past time.Duration's range (Check refuses such a start):
		// never a time in the past, which ran the task without a pause.
		{"start centuries ago", Schedule{Interval: Duration(10 * time.Second), Start: time.Date(226, 1, 1, 0, 0, 0, 0, time.UTC)}, at(0), 0, 0, time.Time{}},
		{"cron past stop", Schedule{Cron: "@hourly", Stop: at(90 * time.Minute)}, at(time.Hour), 0, 0, time.Time{}},
	} {
		got, ok := c.s.Next(c.after, t0, c.runs, c.offset)
		if ok != !c.want.IsZero() || !got.Equal(c.want) {
			t.Errorf("%s: Next = %v, %v; want %v", c.name, got, ok, c.want)
		}
	}
}

func TestSplayOffset(t *testing.T) {
	splay := Duration(10 * time.Second)
	if SplayOffset(0, "a", "t") != 0 {
		t.Error("no splay, an offset")
	}
	if SplayOffset(splay, "a", "t") != SplayOffset(splay, "a", "t") {
		t.Error("a member's offset changes")
	}
	// Spread: 1,000 members over 10 buckets of one second each.
	var buckets [10]int
	for i := range 1000 {
		off := SplayOffset(splay, string(rune('a'+i%26))+string(rune(i)), "collect")
		if off < 0 || off >= time.Duration(splay) {
			t.Fatalf("offset %v outside [0, %v)", off, time.Duration(splay))
		}
		buckets[off/time.Second]++
	}
	for i, n := range buckets {
		if n < 50 || n > 150 {
			t.Errorf("second %d of the splay holds %d of 1,000 members: %v", i, n, buckets)
		}
	}
}
