package node

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node/api/events"
)

// watchAll watches every event of n until the test ends, once n has
// taken its baseline.
func watchAll(t *testing.T, n *Node) <-chan events.Event {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	got := make(chan events.Event, 1024)
	ready := make(chan struct{})
	go n.Watch(ctx, "", func(e *events.Event) {
		if e == nil {
			close(ready)
			return
		}
		select {
		case got <- *e:
		default: // the test reads no more
		}
	})
	<-ready
	return got
}

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
	got := watchAll(t, a) // the baseline is taken: b is new to it
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

// A stranger's record may claim any plugin states: a watcher sees the
// stranger arrive, not what it claims of its plugins, and an error is cut
// to 1 KiB.
func TestWatchIgnoresAStrangersPluginStates(t *testing.T) {
	a, _ := trustedAdmin(t)
	got := watchAll(t, a)
	plugins := map[string]any{}
	for i := range 60 { // within the 8 KiB a record of a node that does not count may have
		plugins[fmt.Sprintf("t%d/p", i)] = map[string]string{"version": "1", "error": strings.Repeat("x", 40)}
	}
	id, _, s := madeUpRecord(t, map[string]any{"name": "stranger", "plugins": plugins}, time.Now())
	if _, err := a.replica.Accept(id, s.Raw); err != nil {
		t.Fatal(err)
	}
	joined := false
	for deadline := time.After(time.Second); ; {
		select {
		case e := <-got:
			switch {
			case e.Node == id.String() && e.Type == events.NodeJoined:
				joined = true
			case e.Type == events.PluginState:
				t.Fatalf("a stranger's plugin state reached the watcher: %+v", e)
			}
			continue
		case <-deadline:
		}
		break
	}
	if !joined {
		t.Fatal("no node-joined event for the stranger")
	}
	if e := events.Translate(events.Change{Key: nodesPrefix + id.String(), New: []byte(`{"plugins":{"t/p":{"error":"` + strings.Repeat("é", 2000) + `"}}}`)}, time.Now(), nil); len(e) != 2 || len(e[1].Error) > 1024 || !utf8.ValidString(e[1].Error) {
		t.Fatalf("an error of 4,000 bytes in an event: %d events, %d bytes", len(e), len(e[len(e)-1].Error))
	}
}

// Made-up identities' records cost what they cost, and no more: the
// decoded name cache lets a record go with its entry, and they do not
// count towards the fleet size that thins out DHT advertising.
func TestStrangersRecordsHoldNothingBack(t *testing.T) {
	// The tombstone below comes as soon as its record: a's clock is
	// moved on for it, as a stranger's record is taken again no sooner
	// than a few seconds after the one held (gossip's pendingRetake).
	var ahead atomic.Int64
	ca := loopbackConfig(t, "admin")
	ca.Trusted = []string{identity(t, ca).String()}
	a := startNodeDeps(t, ca, Deps{Now: func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }})
	var last peer.ID
	var lastKey crypto.PrivKey
	for i := range 50 {
		// Written a while ago: a new version of it (the tombstone below)
		// is taken only gossip.PendingRewrite after it.
		id, key, s := madeUpRecord(t, map[string]any{"name": fmt.Sprintf("s%d", i)}, time.Now().Add(-2*gossip.PendingRewrite))
		if _, err := a.replica.Accept(id, s.Raw); err != nil {
			t.Fatal(err)
		}
		last, lastKey = id, key
	}
	if got := a.fleetSize(); got != 1 {
		t.Errorf("fleet size %d with 50 strangers' records, want 1 (this node)", got)
	}
	if rec, ok := a.nodeNamed(last); !ok || rec.Name != "s49" {
		t.Fatalf("the last stranger's record: %+v %v", rec, ok)
	}
	ahead.Store(int64(gossip.PendingRewrite))
	gone, _ := gossip.Sign(gossip.Entry{Key: nodesPrefix + last.String(), Deleted: true, HLC: gossip.Next(0, time.Now())}, lastKey)
	if _, err := a.replica.Accept(last, gone.Raw); err != nil {
		t.Fatal(err)
	}
	if _, cached := a.records.Load(nodesPrefix + last.String()); cached {
		t.Error("a deleted record is still cached decoded")
	}
}
