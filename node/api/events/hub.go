package events

import (
	"context"
	"errors"
	"strings"
	"sync"
)

// DefaultBuffer is how many events a watcher may fall behind by before
// the oldest are dropped.
const DefaultBuffer = 1024

// ErrClosed is returned by Next once the hub is closed (the agent is
// shutting down).
var ErrClosed = errors.New("events: the agent is shutting down")

// Hub fans events out to subscriptions. Publish never blocks on a
// subscriber: each has its own bounded buffer. Its methods are safe for
// concurrent use.
type Hub struct {
	size   int
	mu     sync.Mutex
	subs   map[*Subscription]struct{}
	closed bool
	// subscribed has a token once a subscription came since the last
	// WaitActive took it.
	subscribed chan struct{}
}

// NewHub returns a hub whose subscriptions buffer size events each
// (DefaultBuffer if size < 1).
func NewHub(size int) *Hub {
	if size < 1 {
		size = DefaultBuffer
	}
	return &Hub{size: size, subs: map[*Subscription]struct{}{}, subscribed: make(chan struct{}, 1)}
}

// WaitActive returns true once anyone is subscribed, at once if someone
// is; false if ctx ends or the hub is closed first. It is for one waiter
// at a time: a publisher that must poll while anyone watches (liveness
// samples) sleeps here, rather than waking every period to find nobody.
func (h *Hub) WaitActive(ctx context.Context) bool {
	for {
		h.mu.Lock()
		active, closed := len(h.subs) > 0, h.closed
		h.mu.Unlock()
		switch {
		case closed:
			return false
		case active:
			return true
		}
		select {
		case <-h.subscribed:
		case <-ctx.Done():
			return false
		}
	}
}

// Active reports whether anyone is subscribed, so publishers can skip the
// work of making events nobody reads.
func (h *Hub) Active() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs) > 0
}

// Publish hands each event to every subscription whose prefix it matches
// (an event with no key matches every prefix). It takes only short locks:
// it is called on the replica's receive path.
func (h *Hub) Publish(evs ...Event) {
	if len(evs) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		s.offer(evs)
	}
}

// Subscribe starts a subscription to the events whose key starts with
// prefix (all events with ""). Close it when done.
func (h *Hub) Subscribe(prefix string) *Subscription {
	s := &Subscription{hub: h, prefix: prefix, ring: newRing(h.size), wake: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		s.closed = true
	} else {
		h.subs[s] = struct{}{}
	}
	select {
	case h.subscribed <- struct{}{}:
	default:
	}
	return s
}

// Close ends every subscription: Next returns ErrClosed once each has
// handed out what it holds. Later subscriptions are closed from the start.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for s := range h.subs {
		s.end()
		delete(h.subs, s)
	}
	select { // a WaitActive returns
	case h.subscribed <- struct{}{}:
	default:
	}
}

// Subscription is one watcher's view of a hub. Next is for one reader at a
// time.
type Subscription struct {
	hub    *Hub
	prefix string
	wake   chan struct{} // has a token when there may be something to read

	mu     sync.Mutex
	ring   *ring
	closed bool
}

func (s *Subscription) offer(evs []Event) {
	s.mu.Lock()
	added := false
	for _, e := range evs {
		if e.Key == "" || strings.HasPrefix(e.Key, s.prefix) {
			s.ring.push(e)
			added = true
		}
	}
	s.mu.Unlock()
	if added {
		s.poke()
	}
}

func (s *Subscription) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Subscription) end() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.poke()
}

// Next returns the next event, waiting for one until ctx ends (ctx's error)
// or the hub closes (ErrClosed, once the events held are handed out).
func (s *Subscription) Next(ctx context.Context) (Event, error) {
	for {
		s.mu.Lock()
		e, ok := s.ring.pop()
		closed := s.closed
		s.mu.Unlock()
		switch {
		case ok:
			return e, nil
		case closed:
			return Event{}, ErrClosed
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// Close ends the subscription. It is safe to call more than once.
func (s *Subscription) Close() {
	s.hub.mu.Lock()
	delete(s.hub.subs, s)
	s.hub.mu.Unlock()
	s.end()
}
