package events

import (
	"slices"
	"strings"
	"time"
)

// Sample is one node's liveness as of one look.
type Sample struct {
	Node  string // peer ID
	Name  string
	State string // "alive", "suspect", "dead", or any later value
}

// Liveness turns samples of every known node's liveness into transitions.
// The first Observe after NewLiveness or Reset sets the baseline and
// reports nothing: watchers hear of changes, not of the fleet as it is. A
// node seen for the first time after that is reported with no From. Note
// takes one node's change as it happens, between samples, so that a state
// shorter than the sampling period is still reported. It is pure and not
// safe for concurrent use.
type Liveness struct {
	last   map[string]string
	primed bool
}

// NewLiveness returns a tracker with no baseline.
func NewLiveness() *Liveness { return &Liveness{last: map[string]string{}} }

// Reset forgets the baseline (nobody watches any more).
func (l *Liveness) Reset() {
	clear(l.last)
	l.primed = false
}

// Note takes node s's liveness as it changed now and returns the
// transition, if it is one; before the first Observe it reports nothing.
func (l *Liveness) Note(s Sample, now time.Time) (Event, bool) {
	if !l.primed {
		return Event{}, false
	}
	was, known := l.last[s.Node]
	l.last[s.Node] = s.State
	if known && was == s.State {
		return Event{}, false
	}
	return l.event(s, was, now), true
}

func (l *Liveness) event(s Sample, was string, now time.Time) Event {
	return Event{Time: now, Type: LivenessPrefix + s.State, Key: "nodes/" + s.Node,
		Node: s.Node, Name: s.Name, State: s.State, From: was}
}

// Observe takes the liveness of every known node now and returns the
// transitions since the last call, sorted by node. A node missing from
// samples is forgotten without an event: its record went away, and the
// state's node-removed event says so.
func (l *Liveness) Observe(samples []Sample, now time.Time) []Event {
	seen := make(map[string]bool, len(samples))
	var out []Event
	for _, s := range samples {
		seen[s.Node] = true
		was, known := l.last[s.Node]
		l.last[s.Node] = s.State
		if !l.primed || (known && was == s.State) {
			continue
		}
		out = append(out, l.event(s, was, now))
	}
	for id := range l.last {
		if !seen[id] {
			delete(l.last, id)
		}
	}
	l.primed = true
	slices.SortFunc(out, func(a, b Event) int { return strings.Compare(a.Node, b.Node) })
	return out
}
