package node

import (
	"context"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api/events"
)

// A watcher of one real node sees another node, crashed right after it
// connected, turn suspect and then dead, in that order. It once went
// from alive straight to dead.
func TestWatchSeesLivenessTransitions(t *testing.T) {
	quickProbes := func(c Config) Config {
		c.ProbeInterval = 200 * time.Millisecond
		c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"} // no lingering QUIC connection after the crash
		return c
	}
	a := startNode(t, quickProbes(loopbackConfig(t, "a")))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan events.Event, 1024)
	ready := make(chan struct{})
	go a.Watch(ctx, "", func(e *events.Event) {
		if e == nil {
			close(ready)
			return
		}
		got <- *e
	})
	<-ready // the baseline is taken: b is new to it
	c := quickProbes(loopbackConfig(t, "b"))
	c.Join = []string{tcpAddr(a)}
	b := startNode(t, c)
	waitFor(t, "a to know b", func() bool { _, ok := a.nodeNamed(b.ID()); return ok && a.liveness(b.ID()) == Alive })
	b.Crash()
	want := []string{"node-suspect", "node-dead"}
	deadline := time.After(30 * time.Second)
	for len(want) > 0 {
		select {
		case e := <-got:
			if e.Node != b.ID().String() || e.Type != want[0] {
				continue
			}
			want = want[1:]
		case <-deadline:
			t.Fatalf("no %s event for b within 30s", want[0])
		}
	}
}
