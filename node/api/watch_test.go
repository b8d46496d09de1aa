package api

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tribeagent/tribe/node/api/events"
)

// watchAgent serves Watch from a hub, as the node does.
type watchAgent struct {
	fakeAgent
	hub *events.Hub
}

func (w watchAgent) Watch(ctx context.Context, prefix string, emit func(*events.Event)) error {
	sub := w.hub.Subscribe(prefix)
	defer sub.Close()
	emit(nil)
	for {
		e, err := sub.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		emit(&e)
	}
}

// Events reach the client one by one, filtered by prefix; cancelling the
// client's context ends the watch cleanly; the agent shutting down ends it
// with an error.
func TestWatchStreams(t *testing.T) {
	hub := events.NewHub(16)
	_, path := listen(t, watchAgent{hub: hub})
	c := NewClient(path)

	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan events.Event)
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		done <- c.Watch(ctx, "tribes/", func() { close(ready) }, func(e events.Event) { got <- e })
	}()
	<-ready
	hub.Publish(events.Event{Type: events.PolicyCreated, Key: "policies/p"},
		events.Event{Type: events.TribeCreated, Key: "tribes/core", Tribe: "core"})
	if e := <-got; e.Type != events.TribeCreated || e.Tribe != "core" {
		t.Fatalf("first event %+v, want tribe-created core (policies/ is filtered out)", e)
	}
	hub.Publish(events.Event{Type: events.TribeDeleted, Key: "tribes/core", Tribe: "core"})
	if e := <-got; e.Type != events.TribeDeleted {
		t.Fatalf("second event %+v", e)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("watch cancelled by its client: %v, want nil", err)
	}

	done2 := make(chan error, 1)
	ready2 := make(chan struct{})
	go func() { done2 <- c.Watch(context.Background(), "", func() { close(ready2) }, func(events.Event) {}) }()
	<-ready2
	hub.Close()
	if err := <-done2; err == nil || !strings.Contains(err.Error(), "shutting down") {
		t.Fatalf("watch ended by the agent: %v, want the shutdown error", err)
	}
	var apiErr *Error
	if _, err := NewClient(path).Status(context.Background()); err != nil && !errors.As(err, &apiErr) {
		t.Fatalf("the server stopped answering after a watch ended: %v", err)
	}
}
