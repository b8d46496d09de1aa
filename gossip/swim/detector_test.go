package swim

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// noTransport answers nothing: the test below drives the detector only
// through its handlers.
type noTransport struct{}

func (noTransport) Ping(context.Context, string, Message) (Message, error) {
	return Message{}, errors.New("no network")
}

func (noTransport) PingReq(context.Context, string, string, Message) (Message, error) {
	return Message{}, errors.New("no network")
}

// TestChangesDeliveredInOrder: claims about one member arrive on many
// goroutines at once, as probes and gossip do. onChange is never called
// twice at once, and it hears the member's states in the order the core
// took them: never suspect after dead of the same incarnation (the core
// refuses that order), which a watcher would show as a node coming back
// from the dead.
func TestChangesDeliveredInOrder(t *testing.T) {
	for round := range 200 {
		var (
			in      atomic.Int32
			overlap atomic.Bool
			mu      sync.Mutex
			seen    []State
		)
		d, err := New(Config{Self: "a"}, noTransport{}, rand.New(rand.NewPCG(uint64(round), 1)), func(cs []Change) {
			if in.Add(1) > 1 {
				overlap.Store(true)
			}
			defer in.Add(-1)
			for range 50 { // widen the window another batch would race into
				runtime.Gosched()
			}
			for _, c := range cs {
				mu.Lock()
				seen = append(seen, c.State)
				mu.Unlock()
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		d.Add("b")
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, s := range []State{Suspect, Dead, Suspect, Dead} {
			from := string(rune('c' + i))
			wg.Go(func() {
				<-start
				d.HandlePing(from, Message{Updates: []Update{{Node: "b", State: s, Incarnation: 0, From: from}}})
			})
		}
		close(start)
		wg.Wait()
		if overlap.Load() {
			t.Fatalf("round %d: onChange called twice at once", round)
		}
		for i := 1; i < len(seen); i++ {
			if seen[i-1] == Dead && seen[i] == Suspect {
				t.Fatalf("round %d: delivered %v: suspect after dead", round, seen)
			}
		}
	}
}
