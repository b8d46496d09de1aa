package node

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/node/api"
)

// quick shortens the liveness intervals of c for tests: dead within a
// second, reaped reconnect after that.
func quick(c Config, reconnect time.Duration) Config {
	c.ProbeInterval = 100 * time.Millisecond
	c.ReconnectTimeout = reconnect
	return c
}

func listed(t *testing.T, n *Node, id peer.ID) bool {
	t.Helper()
	nodes, err := n.Nodes(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(nodes, func(x api.Node) bool { return x.ID == id.String() })
}

// A node that stops cleanly is left to its peers, not suspect then dead,
// and alive again when it comes back; `tribe leave` (LeaveCluster) says
// farewell, has it acknowledged, and asks the agent to stop.
func TestCleanStopLeaves(t *testing.T) {
	var ahead atomic.Int64 // a's clock runs ahead of the real one by this much
	a := startNodeDeps(t, quick(loopbackConfig(t, "a"), time.Hour), Deps{Now: func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }})
	cb := quick(loopbackConfig(t, "b"), time.Hour)
	cb.Join = []string{tcpAddr(a)}
	b := startNode(t, cb)
	bid := b.ID()
	waitFor(t, "a to see b alive", func() bool { return a.liveness(bid) == Alive && len(b.ConnectedPeers()) == 1 })
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// Left at once (the farewell was acknowledged before Close returned,
	// whatever the connection does), and still left when a crashed node
	// would be dead.
	if got := a.liveness(bid); got != Left {
		t.Fatalf("b after a clean stop: %s, want left", got)
	}
	ahead.Store(int64(10 * cb.ProbeInterval))
	if got := a.liveness(bid); got != Left {
		t.Fatalf("b well after a clean stop: %s, want left", got)
	}
	if !listed(t, a, bid) {
		t.Fatal("a left node within the reconnect timeout is not listed")
	}

	ahead.Store(0)
	b = startNode(t, cb)
	waitFor(t, "b to be alive again on a", func() bool { return a.liveness(bid) == Alive })

	res, err := b.LeaveCluster(context.Background())
	if err != nil || res.Acked < 1 || res.Error != "" {
		t.Fatalf("LeaveCluster: %+v, %v; want at least one acknowledgement", res, err)
	}
	select {
	case <-b.Leaving():
	default:
		t.Fatal("LeaveCluster did not ask the agent to stop")
	}
	if got := a.liveness(bid); got != Left {
		t.Fatalf("b after tribe leave: %s, want left", got)
	}
}

// A host restarted under one name with a fresh identity: once the old
// identity is dead past the reconnect timeout it is reaped, its name is
// free, the new node can be admitted under it and the name resolves to
// it. Before the timeout the name is held.
func TestReapedNodeFreesItsName(t *testing.T) {
	ctx := context.Background()
	ca := quick(loopbackConfig(t, "admin"), 2*time.Second)
	ca.Trusted = []string{identity(t, ca).String()}
	admin := startNode(t, ca)
	web := func() *Node {
		c := quick(loopbackConfig(t, "web"), time.Hour)
		c.Trusted, c.Join = ca.Trusted, []string{tcpAddr(admin)}
		return startNode(t, c)
	}
	old := web()
	waitFor(t, "admin to know the first web", func() bool { _, ok := admin.nodeNamed(old.ID()); return ok })
	if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{old.ID().String()}}); err != nil {
		t.Fatal(err)
	}
	if err := old.Crash(); err != nil {
		t.Fatal(err)
	}
	fresh := web()
	waitFor(t, "admin to know the second web", func() bool { _, ok := admin.nodeNamed(fresh.ID()); return ok })
	if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{fresh.ID().String()}}); err == nil || !strings.Contains(err.Error(), "is held by node "+old.ID().String()) {
		t.Fatalf("admitting under a name a node dead for less than the reconnect timeout holds: %v", err)
	}
	waitFor(t, "the old web to be reaped on admin", func() bool { return !listed(t, admin, old.ID()) })
	if got := admin.liveness(old.ID()); got != Dead {
		t.Fatalf("the reaped web: %s, want dead", got)
	}
	if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{fresh.ID().String()}}); err != nil {
		t.Fatalf("admitting under a reaped node's name: %v", err)
	}
	ids, err := admin.resolve([]string{"web"})
	if err != nil || len(ids) != 1 || ids[0] != fresh.ID() {
		t.Fatalf("web resolves to %v, %v; want the new node %s", ids, err, fresh.ID())
	}
}

// force-leave: refused from a node that is not a trusted writer; from a
// trusted writer it makes a gone node left and reaped at once, freeing its
// name; a live node force-left writes a newer record and is back.
func TestForceLeave(t *testing.T) {
	ctx := context.Background()
	ca := quick(loopbackConfig(t, "admin"), time.Hour)
	ca.Trusted = []string{identity(t, ca).String()}
	admin := startNode(t, ca)
	start := func(name string) *Node {
		c := quick(loopbackConfig(t, name), time.Hour)
		c.Trusted, c.Join = ca.Trusted, []string{tcpAddr(admin)}
		return startNode(t, c)
	}
	old, other := start("web"), start("db")
	waitFor(t, "every node to know the others", func() bool {
		return len(admin.nodeRecords()) == 3 && len(other.nodeRecords()) == 3
	})
	if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{"web", "db"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.ForceLeave(ctx, []string{old.ID().String()}); statusOf(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "trusted writer") {
		t.Fatalf("force-leave from an admitted node that is not a trusted writer: %v", err)
	}
	if _, ok := admin.replica.Get(forcedPrefix + old.ID().String()); ok {
		t.Fatal("a refused force-leave was written")
	}
	if _, err := admin.ForceLeave(ctx, []string{"admin"}); statusOf(err) != http.StatusBadRequest {
		t.Fatalf("force-leave of itself: %v", err)
	}

	if err := old.Crash(); err != nil {
		t.Fatal(err)
	}
	res, err := admin.ForceLeave(ctx, []string{"web"})
	if err != nil || len(res) != 1 || res[0].Liveness != Left {
		t.Fatalf("force-leave: %+v, %v", res, err)
	}
	if listed(t, admin, old.ID()) {
		t.Fatal("a force-left node is still listed")
	}
	waitFor(t, "db to see web force-left", func() bool { return other.liveness(old.ID()) == Left && !listed(t, other, old.ID()) })
	fresh := start("web")
	waitFor(t, "admin to know the new web", func() bool { _, ok := admin.nodeNamed(fresh.ID()); return ok })
	if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{fresh.ID().String()}}); err != nil {
		t.Fatalf("admitting under a force-left node's name: %v", err)
	}

	// db is up: it answers a force-leave with a newer record.
	if _, err := admin.ForceLeave(ctx, []string{"db"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "db to be back on admin", func() bool { return admin.liveness(other.ID()) == Alive && listed(t, admin, other.ID()) })
}

// Under open trust a host rebuilt under one name leaves its old identity
// behind: force-leave by that name takes out the gone one, not the live.
func TestForceLeaveByNameTakesTheGone(t *testing.T) {
	ctx := context.Background()
	admin := startNode(t, quick(loopbackConfig(t, "admin"), time.Hour))
	web := func() *Node {
		c := quick(loopbackConfig(t, "web"), time.Hour)
		c.Join = []string{tcpAddr(admin)}
		return startNode(t, c)
	}
	old := web()
	waitFor(t, "admin to know the old web", func() bool { _, ok := admin.nodeNamed(old.ID()); return ok })
	if err := old.Crash(); err != nil {
		t.Fatal(err)
	}
	fresh := web()
	waitFor(t, "admin to see the old web dead, the new one alive with its record", func() bool {
		_, known := admin.nodeNamed(fresh.ID())
		return known && admin.liveness(old.ID()) == Dead && admin.liveness(fresh.ID()) == Alive
	})
	res, err := admin.ForceLeave(ctx, []string{"web"})
	if err != nil || len(res) != 1 || res[0].ID != old.ID().String() {
		t.Fatalf("force-leave web: %+v, %v; want the old one only", res, err)
	}
	if listed(t, admin, old.ID()) || !listed(t, admin, fresh.ID()) {
		t.Fatalf("force-leave by name took the wrong node: old listed %v (%s), fresh listed %v (%s)", listed(t, admin, old.ID()), admin.liveness(old.ID()), listed(t, admin, fresh.ID()), admin.liveness(fresh.ID()))
	}
}
