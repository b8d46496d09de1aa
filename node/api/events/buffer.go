package events

// ring is a watcher's bounded queue of events. Full, it drops the oldest
// event and counts it, so a watcher that falls behind loses the past, never
// the present, and is told how much it lost. It is not safe for concurrent
// use; Subscription guards it.
type ring struct {
	buf        []Event
	head, n    int
	dropped    int64
	lastDropAt Event // the newest dropped event, for the dropped event's time
}

func newRing(size int) *ring { return &ring{buf: make([]Event, size)} }

// push adds e, dropping the oldest event if the ring is full.
func (r *ring) push(e Event) {
	if r.n == len(r.buf) {
		r.lastDropAt = r.buf[r.head]
		r.buf[r.head] = Event{}
		r.head = (r.head + 1) % len(r.buf)
		r.n--
		r.dropped++
	}
	r.buf[(r.head+r.n)%len(r.buf)] = e
	r.n++
}

// pop returns the next event to hand out: a Dropped event with the count
// if events were dropped since the last pop (the lost events came before
// every event still held), else the oldest event held.
func (r *ring) pop() (Event, bool) {
	if r.dropped > 0 {
		e := Event{Time: r.lastDropAt.Time, Type: Dropped, Count: r.dropped}
		r.dropped, r.lastDropAt = 0, Event{}
		return e, true
	}
	if r.n == 0 {
		return Event{}, false
	}
	e := r.buf[r.head]
	r.buf[r.head] = Event{}
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	return e, true
}
