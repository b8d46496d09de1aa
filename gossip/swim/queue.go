package swim

import (
	"cmp"
	"slices"
)

// queue holds the changes a node is spreading, one per member (a newer
// change replaces an older), each with how many times it was sent:
// memberlist's TransmitLimitedQueue, small enough to sort.
type queue struct {
	items []*queued
	seq   uint64
}

type queued struct {
	u    Update
	sent int
	seq  uint64 // newer changes go first among equally sent ones
}

func (q *queue) len() int { return len(q.items) }

// push queues u in place of what was queued about the same member,
// except other members' confirmations of the same suspicion (all travel).
func (q *queue) push(u Update) {
	q.seq++
	q.items = slices.DeleteFunc(q.items, func(it *queued) bool {
		confirms := it.u.State == Suspect && u.State == Suspect && it.u.Incarnation == u.Incarnation && it.u.From != u.From
		return it.u.Node == u.Node && !confirms
	})
	q.items = append(q.items, &queued{u: u, seq: q.seq})
}

// drop forgets what was queued about node.
func (q *queue) drop(node string) {
	q.items = slices.DeleteFunc(q.items, func(it *queued) bool { return it.u.Node == node })
}

// take returns up to n updates, the least sent first (newest first among
// equals), counts each as sent once more, and drops those sent limit
// times.
func (q *queue) take(n, limit int) []Update {
	if len(q.items) == 0 {
		return nil
	}
	slices.SortFunc(q.items, func(a, b *queued) int {
		if a.sent != b.sent {
			return a.sent - b.sent
		}
		return cmp.Compare(b.seq, a.seq)
	})
	out := make([]Update, 0, min(n, len(q.items)))
	for _, it := range q.items[:min(n, len(q.items))] {
		out = append(out, it.u)
		it.sent++
	}
	q.items = slices.DeleteFunc(q.items, func(it *queued) bool { return it.sent >= limit })
	return out
}
