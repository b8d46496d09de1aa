package node

import (
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// warnLimit lets at most one warning per key (a peer) through per
// interval, so a peer that misbehaves in a loop cannot flood the log; what
// it holds back is counted, and the next warning let through says so. It
// only decides: counters of the events themselves stay with the caller,
// exact. Safe for concurrent use.
type warnLimit struct {
	every   time.Duration
	maxKeys int
	now     func() time.Time

	mu   sync.Mutex
	last map[string]*warnSlot
	// overflow counts warnings held back for keys the full table could not
	// track; the next warning let through reports them with its own.
	overflow int
}

type warnSlot struct {
	at   time.Time // when the last warning was let through
	held int       // held back since
}

// newWarnLimit lets one warning per key through every interval, tracking
// at most maxKeys keys at once, on the clock now.
func newWarnLimit(every time.Duration, maxKeys int, now func() time.Time) *warnLimit {
	return &warnLimit{every: every, maxKeys: maxKeys, now: now, last: map[string]*warnSlot{}}
}

// allow reports whether a warning about key may be logged now, and if so
// how many similar ones were held back before it.
func (l *warnLimit) allow(key string) (ok bool, held int) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	s, tracked := l.last[key]
	if !tracked {
		if len(l.last) >= l.maxKeys {
			l.forget(now)
		}
		if len(l.last) >= l.maxKeys {
			l.overflow++
			return false, 0
		}
		l.last[key] = &warnSlot{at: now}
		held, l.overflow = l.overflow, 0
		return true, held
	}
	if now.Sub(s.at) < l.every {
		s.held++
		return false, 0
	}
	held, l.overflow = s.held+l.overflow, 0
	*s = warnSlot{at: now}
	return true, held
}

// forget drops the keys whose interval has passed. Their held-back counts
// go unreported; the caller's counters still have them.
func (l *warnLimit) forget(now time.Time) {
	for k, s := range l.last {
		if now.Sub(s.at) >= l.every {
			delete(l.last, k)
		}
	}
}

// warn logs msg at WARN on log if allow(key) lets it through, saying how
// many similar warnings were held back before it.
func (l *warnLimit) warn(log *slog.Logger, key, msg string, args ...any) {
	ok, held := l.allow(key)
	if !ok {
		return
	}
	if held > 0 {
		msg = fmt.Sprintf("%s (%d similar suppressed)", msg, held)
	}
	log.Warn(msg, args...)
}
