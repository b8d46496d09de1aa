package events

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func ev(i int) Event {
	return Event{Time: time.Unix(int64(i), 0), Type: TribeCreated, Key: fmt.Sprintf("tribes/t%d", i), Tribe: fmt.Sprintf("t%d", i)}
}

func TestRingDropsOldestAndCounts(t *testing.T) {
	r := newRing(3)
	for i := 1; i <= 7; i++ {
		r.push(ev(i))
	}
	var got []Event
	for {
		e, ok := r.pop()
		if !ok {
			break
		}
		got = append(got, e)
	}
	if len(got) != 4 {
		t.Fatalf("got %d events, want dropped + 3: %+v", len(got), got)
	}
	if got[0].Type != Dropped || got[0].Count != 4 || !got[0].Time.Equal(time.Unix(4, 0)) {
		t.Fatalf("first = %+v, want dropped 4 at the newest lost event's time", got[0])
	}
	for i, e := range got[1:] {
		if e.Tribe != fmt.Sprintf("t%d", i+5) {
			t.Fatalf("event %d = %s, want t%d: the newest survive, in order", i, e.Tribe, i+5)
		}
	}
	// The count starts again after it was handed out.
	r.push(ev(8))
	if e, _ := r.pop(); e.Type == Dropped {
		t.Fatalf("dropped reported twice")
	}
}

func TestRingWrapsWithoutLoss(t *testing.T) {
	r := newRing(2)
	for i := 1; i <= 10; i++ {
		r.push(ev(i))
		e, ok := r.pop()
		if !ok || e.Tribe != fmt.Sprintf("t%d", i) {
			t.Fatalf("pop %d = %+v, %v", i, e, ok)
		}
	}
	if _, ok := r.pop(); ok {
		t.Fatal("empty ring popped an event")
	}
}

// A watcher that never reads does not hold up Publish nor other watchers;
// it finds out what it missed.
func TestHubSlowWatcherNeverBlocks(t *testing.T) {
	h := NewHub(4)
	slow := h.Subscribe("")
	defer slow.Close()
	fast := h.Subscribe("tribes/t")
	defer fast.Close()
	ctx := context.Background()
	for i := 1; i <= 100; i++ {
		h.Publish(ev(i)) // returns although slow reads nothing
		e, err := fast.Next(ctx)
		if err != nil || e.Tribe != fmt.Sprintf("t%d", i) {
			t.Fatalf("fast watcher got %+v, %v at %d", e, err, i)
		}
	}
	e, err := slow.Next(ctx)
	if err != nil || e.Type != Dropped || e.Count != 96 {
		t.Fatalf("slow watcher first got %+v, %v; want dropped 96", e, err)
	}
	for i := 97; i <= 100; i++ {
		if e, _ := slow.Next(ctx); e.Tribe != fmt.Sprintf("t%d", i) {
			t.Fatalf("slow watcher got %+v, want t%d", e, i)
		}
	}
}

func TestHubPrefixFilter(t *testing.T) {
	h := NewHub(8)
	s := h.Subscribe("tribes/core")
	defer s.Close()
	h.Publish(
		Event{Type: TribeCreated, Key: "tribes/web"},
		Event{Type: PolicyCreated, Key: "policies/p"},
		Event{Type: TribeCreated, Key: "tribes/core"},
		Event{Type: MemberAdded, Key: "tribes/core/members/P/manual"},
	)
	for _, want := range []string{"tribes/core", "tribes/core/members/P/manual"} {
		if e, _ := s.Next(context.Background()); e.Key != want {
			t.Fatalf("got %q, want %q", e.Key, want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next on an empty subscription with a cancelled context: %v", err)
	}
}

func TestHubCloseEndsWatchers(t *testing.T) {
	h := NewHub(8)
	s := h.Subscribe("")
	h.Publish(ev(1))
	if !h.Active() {
		t.Fatal("a subscribed hub is not active")
	}
	done := make(chan error, 1)
	go func() {
		s.Next(context.Background()) // the held event first
		_, err := s.Next(context.Background())
		done <- err
	}()
	h.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Close: %v, want ErrClosed", err)
	}
	if h.Active() {
		t.Fatal("a closed hub is active")
	}
	if _, err := h.Subscribe("").Next(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("subscribing to a closed hub: %v, want ErrClosed", err)
	}
}

// WaitActive sleeps until a subscription comes (at once if one is there),
// and gives up when its context ends or the hub closes.
func TestHubWaitActive(t *testing.T) {
	h := NewHub(4)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if h.WaitActive(ctx) {
		t.Fatal("WaitActive with nobody subscribed returned true")
	}

	got := make(chan bool)
	go func() { got <- h.WaitActive(context.Background()) }()
	select {
	case <-got:
		t.Fatal("WaitActive returned before anyone subscribed")
	case <-time.After(20 * time.Millisecond):
	}
	s := h.Subscribe("")
	if !<-got {
		t.Fatal("WaitActive returned false once someone subscribed")
	}
	if !h.WaitActive(context.Background()) {
		t.Fatal("WaitActive with a subscription returned false")
	}
	s.Close()

	go func() { got <- h.WaitActive(context.Background()) }()
	h.Close()
	if <-got {
		t.Fatal("WaitActive returned true when the hub closed")
	}
}
