package node

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestWarnLimit(t *testing.T) {
	type step struct {
		key  string
		at   time.Duration // since the start
		ok   bool
		held int
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"first warning of a key passes", []step{{"a", 0, true, 0}}},
		{"repeats within the interval are held and counted", []step{
			{"a", 0, true, 0}, {"a", time.Second, false, 0}, {"a", 59 * time.Second, false, 0},
			{"a", time.Minute, true, 2}, {"a", time.Minute + time.Second, false, 0},
		}},
		{"keys are limited apart", []step{
			{"a", 0, true, 0}, {"b", 0, true, 0}, {"a", time.Second, false, 0}, {"b", time.Second, false, 0},
		}},
		{"a quiet key starts afresh", []step{
			{"a", 0, true, 0}, {"a", 10 * time.Minute, true, 0},
		}},
		{"a full table forgets keys whose interval passed", []step{
			{"a", 0, true, 0}, {"b", 0, true, 0}, {"c", time.Minute, true, 0}, {"a", time.Minute, true, 0},
		}},
		{"a full table holds new keys, and the next warning counts them", []step{
			{"a", 0, true, 0}, {"b", 0, true, 0}, {"c", time.Second, false, 0}, {"d", time.Second, false, 0},
			{"a", time.Second, false, 0}, {"a", time.Minute, true, 3},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
			now := start
			l := newWarnLimit(time.Minute, 2, func() time.Time { return now })
			for i, s := range c.steps {
				now = start.Add(s.at)
				if ok, held := l.allow(s.key); ok != s.ok || held != s.held {
					t.Fatalf("step %d (%s at %v): allow = %v, %d; want %v, %d", i, s.key, s.at, ok, held, s.ok, s.held)
				}
			}
		})
	}
}

func TestWarnLimitSaysWhatItHeldBack(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	now := time.Now()
	l := newWarnLimit(time.Minute, 16, func() time.Time { return now })
	for range 5 {
		l.warn(log, "p", "hello: bad message", "peer", "p")
	}
	now = now.Add(time.Minute)
	l.warn(log, "p", "hello: bad message", "peer", "p")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || strings.Contains(lines[0], "suppressed") || !strings.Contains(lines[1], `"hello: bad message (4 similar suppressed)"`) {
		t.Fatalf("logged:\n%s", buf.String())
	}
}
