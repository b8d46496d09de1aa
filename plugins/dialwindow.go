package plugins

import (
	"context"
	"sync"
)

// dialWindow bounds a caller's dials in flight the way TCP bounds a
// connection's segments: it starts wide, halves on each dial that timed
// out, and widens by one on each that did not. A fan-out to hosts it is
// not connected to dials them all; on a host too busy to finish that many
// handshakes by their deadline (a join storm, a small VM), all of them
// time out together and are made again together, and none ever finishes
// (seen: 15 of 140 answered in two minutes). Fewer at once finish.
type dialWindow struct {
	mu       sync.Mutex
	limit    int // maxDials at most, minDials at least
	inFlight int
	room     chan struct{} // closed, and replaced, when room may have opened
}

// The window's bounds: as wide as a `tribe call`'s calls in flight by
// default (CallParallel), and never narrower than a few dials.
const (
	maxDials = 64
	minDials = 4
)

func newDialWindow() *dialWindow {
	return &dialWindow{limit: maxDials, room: make(chan struct{})}
}

// acquire waits for room for one more dial, or ctx's end.
func (w *dialWindow) acquire(ctx context.Context) error {
	for {
		w.mu.Lock()
		if w.inFlight < w.limit {
			w.inFlight++
			w.mu.Unlock()
			return nil
		}
		room := w.room
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-room:
		}
	}
}

// release ends a dial: one that timed out halves the window, any other
// widens it by one.
func (w *dialWindow) release(timedOut bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inFlight--
	if timedOut {
		w.limit = max(minDials, w.limit/2)
	} else {
		w.limit = min(maxDials, w.limit+1)
	}
	close(w.room)
	w.room = make(chan struct{})
}
