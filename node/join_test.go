package node

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/p2p/protocol/identify"

	"github.com/tribeagent/tribe/internal/syncbuf"
	"github.com/tribeagent/tribe/keys"
	"github.com/tribeagent/tribe/node/api"
)

// joinOf is n's status of its only --join address.
func joinOf(t *testing.T, n *Node) api.Join {
	t.Helper()
	st, err := n.Status(context.Background())
	if err != nil || len(st.Joins) != 1 {
		t.Fatalf("status joins: %+v, %v", st.Joins, err)
	}
	return st.Joins[0]
}

// tcpHostPort is n's TCP listen address as HOST:PORT.
func tcpHostPort(t *testing.T, n *Node) string {
	t.Helper()
	tcp, _ := listenPorts(t, n)
	return net.JoinHostPort("127.0.0.1", tcp)
}

func TestJoinByHostPortLearnsThePeerID(t *testing.T) {
	a := startNode(t, loopbackConfig(t, "a"))
	hostPort := tcpHostPort(t, a)
	_, port, _ := net.SplitHostPort(hostPort)
	for _, addr := range []string{hostPort, "localhost:" + port, "/ip4/127.0.0.1/tcp/" + port, "/dns4/localhost/tcp/" + port} {
		t.Run(addr, func(t *testing.T) {
			c := loopbackConfig(t, "b")
			c.Join = []string{addr}
			b := startNode(t, c)
			waitFor(t, "b to join a by "+addr, func() bool { return joinOf(t, b).State == api.JoinJoined })
			if j := joinOf(t, b); j.ID != a.ID().String() || j.Addr != addr || j.Cluster != "tribe" || j.Error != "" {
				t.Fatalf("join status: %+v, want a's ID %s", j, a.ID())
			}
			if peers := b.ConnectedPeers(); len(peers) != 1 || peers[0] != a.ID() {
				t.Fatalf("b's peers: %v", peers)
			}
		})
	}
}

func TestJoinOfAnotherClusterIsReported(t *testing.T) {
	a := startNode(t, loopbackConfig(t, "a"))
	logs := &syncbuf.Buffer{}
	c := loopbackConfig(t, "b")
	c.Cluster = "other"
	c.Join = []string{tcpAddr(a)}
	b := startNodeDeps(t, c, Deps{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	waitFor(t, "b to find a is of another cluster", func() bool { return joinOf(t, b).State == api.JoinOtherCluster })
	if j := joinOf(t, b); j.Cluster != "tribe" || j.ID != a.ID().String() {
		t.Fatalf("join status: %+v", j)
	}
	out := logs.String()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "join peer belongs to another cluster") || !strings.Contains(out, "its_cluster=tribe") {
		t.Fatalf("no warning that the join peer is of another cluster:\n%s", out)
	}
	if strings.Contains(out, `msg=joined`) {
		t.Fatalf("says joined to a peer of another cluster:\n%s", out)
	}
}

func TestJoinByHostPortWithASwarmKey(t *testing.T) {
	dir := t.TempDir()
	writeKey := func(name string, b byte) string {
		k := [32]byte{b}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, keys.FormatSwarmKey(k), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	fleetKey, otherKey := writeKey("fleet.key", 1), writeKey("other.key", 2)
	private := func(name, key, join string) Config {
		c := loopbackConfig(t, name)
		c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
		c.SwarmKeyFile = key
		if join != "" {
			c.Join = []string{join}
		}
		return c
	}
	a := startNode(t, private("a", fleetKey, ""))
	join := tcpHostPort(t, a)
	b := startNode(t, private("b", fleetKey, join))
	waitFor(t, "b to join a over the private network", func() bool { return joinOf(t, b).State == api.JoinJoined })

	for _, key := range []string{otherKey, ""} {
		n := startNode(t, private("outsider", key, join))
		waitFor(t, "the outsider's join to fail", func() bool { return joinOf(t, n).State == api.JoinUnreachable })
		if j := joinOf(t, n); !strings.Contains(j.Error, "another swarm key") || j.ID != "" {
			t.Fatalf("outsider with key %q: %+v", key, j)
		}
		n.Close()
	}
}

func TestJoinOfItselfIsIgnored(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c := loopbackConfig(t, "a")
	c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/" + strings.Split(addr, ":")[1]}
	c.Join = []string{addr} // the same join list on every host, the seed's included
	a := startNode(t, c)
	waitFor(t, "a to see the join address is its own", func() bool { return joinOf(t, a).State == api.JoinSelf })
	if j := joinOf(t, a); j.ID != a.ID().String() {
		t.Fatalf("join status: %+v", j)
	}
}

// Two nodes that joined the same seed find each other through the node
// records the state brings them: no DHT, no mDNS.
func TestPeersFoundThroughTheirRecords(t *testing.T) {
	ac := loopbackConfig(t, "a")
	ac.DHT = false
	a := startNode(t, ac)
	var ns []*Node
	for _, name := range []string{"b", "c"} {
		c := loopbackConfig(t, name)
		c.DHT, c.Join, c.DiscoveryInterval = false, []string{tcpAddr(a)}, 200*time.Millisecond
		ns = append(ns, startNode(t, c))
	}
	waitFor(t, "b and c connected to each other", func() bool { return ns[0].isConnected(ns[1].ID()) })
}

// A join peer that is connected but never says hello (here a bare libp2p
// host, which does not speak HelloProtocol) is dialled afresh once
// joinUnheard has passed: the node does not sit on a connection that
// never made it a peer.
func TestJoinPeerSilentIsDialledAgain(t *testing.T) {
	h := listeningHost(t)
	var conns atomic.Int32
	h.Network().Notify(&network.NotifyBundle{ConnectedF: func(network.Network, network.Conn) { conns.Add(1) }})

	var offset atomic.Int64 // the node's clock runs ahead of the real one by this
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	logs := &syncbuf.Buffer{}
	c := loopbackConfig(t, "a")
	c.Join = []string{h.Addrs()[0].String() + "/p2p/" + h.ID().String()}
	n := startNodeDeps(t, c, Deps{Logger: slog.New(slog.NewTextHandler(logs, nil)), Now: clock})
	waitFor(t, "the node to connect to its join peer", func() bool { return joinOf(t, n).State == api.JoinConnected })
	time.Sleep(200 * time.Millisecond) // a few of keepJoined's rounds (BackoffMin 50 ms)
	if got := conns.Load(); got != 1 || n.joinRedials.Load() != 0 {
		t.Fatalf("before joinUnheard: %d connections, %d redials; want 1 and 0", got, n.joinRedials.Load())
	}

	offset.Store(int64(joinUnheard))
	waitFor(t, "the node to dial its silent join peer again", func() bool { return conns.Load() >= 2 })
	if n.joinRedials.Load() < 1 {
		t.Fatalf("redialled without counting it")
	}
	if !strings.Contains(logs.String(), "join peer connected but said no hello") {
		t.Fatalf("no word of the redial:\n%s", logs.String())
	}
	if j := joinOf(t, n); j.State != api.JoinConnected && j.State != api.JoinConnecting {
		t.Fatalf("join status after the redial: %+v", j)
	}
}

// A join peer whose connection stands though the dial gave up (identify
// not done by the deadline: here a host that never answers it) is waited
// on for a hello like any connected one, and dialled again once
// joinUnheard has passed; it used to stay "unreachable", connected, and
// never be dialled again.
func TestJoinPeerWhoseIdentifyTimedOutIsDialledAgain(t *testing.T) {
	old := joinDialTimeout
	joinDialTimeout = 300 * time.Millisecond
	t.Cleanup(func() { joinDialTimeout = old })
	h := listeningHost(t)
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) })
	h.SetStreamHandler(identify.ID, func(s network.Stream) { <-stuck; s.Reset() })
	var conns atomic.Int32
	h.Network().Notify(&network.NotifyBundle{ConnectedF: func(network.Network, network.Conn) { conns.Add(1) }})

	var offset atomic.Int64 // the node's clock runs ahead of the real one by this
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	c := loopbackConfig(t, "a")
	c.Join = []string{h.Addrs()[0].String() + "/p2p/" + h.ID().String()}
	n := startNodeDeps(t, c, Deps{Now: clock})
	waitFor(t, "the node's dial to give up on identify, connected", func() bool {
		return joinOf(t, n).State == api.JoinConnected && conns.Load() == 1
	})
	offset.Store(int64(joinUnheard))
	waitFor(t, "the node to dial its join peer again", func() bool { return conns.Load() >= 2 })
	if n.joinRedials.Load() < 1 {
		t.Fatalf("redialled without counting it")
	}
}

// Only the first redial for want of a hello since the peer was last heard
// is worth an info line; a hello starts the count again.
func TestJoinSilentRedialsLogOnce(t *testing.T) {
	j := newJoin(joinTarget{given: "x"})
	if !j.redialSilent(time.Minute) || j.redialSilent(time.Minute) {
		t.Fatal("want the first redial reported, not the second")
	}
	if st := j.status(); st.State != api.JoinConnecting || !strings.Contains(st.Error, "no hello in 1m0s") {
		t.Fatalf("status after a redial: %+v", st)
	}
	j.set("", api.JoinJoined, "tribe", "")
	if !j.redialSilent(time.Minute) {
		t.Fatal("after a hello the next redial is the first again")
	}
}

// A join peer that is down is dialled again on the join's own backoff,
// never refused by the swarm's (which grows to 5 minutes and answers
// "dial backoff" without dialling), and joined once it is back.
func TestJoinPeerDownIsDialledOnTheJoinsOwnBackoff(t *testing.T) {
	ca := loopbackConfig(t, "a")
	a := startNode(t, ca)
	tcp, _ := listenPorts(t, a)
	addr := tcpAddr(a)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}

	logs := &syncbuf.Buffer{}
	cb := loopbackConfig(t, "b")
	cb.Join = []string{addr}
	cb.BackoffMin, cb.BackoffMax = 20*time.Millisecond, 100*time.Millisecond
	b := startNodeDeps(t, cb, Deps{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	// The swarm backs a failed address off for 5 s at first: six failed
	// dials in well under that are the join's own.
	waitFor(t, "b to fail to dial a six times", func() bool { return strings.Contains(logs.String(), "failures=6") })
	if out := logs.String(); strings.Contains(out, "dial backoff") {
		t.Fatalf("b's dials of its join peer were refused by the swarm's backoff:\n%s", out)
	}

	ca.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/" + tcp}
	startNode(t, ca) // a again: its data dir keeps its identity
	waitFor(t, "b to join a once it is back", func() bool { return joinOf(t, b).State == api.JoinJoined })
}

func TestJoinDueAt(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	lo, hi := time.Second, time.Minute
	for _, c := range []struct {
		name          string
		sheds         int
		shedAgo       time.Duration
		joined, short bool
		want          bool
	}{
		{"never joined, never turned away: dialled", 0, 0, false, false, true},
		{"never joined, short: dialled", 0, 0, false, true, true},
		{"joined once, not short: its part is done", 0, 0, true, false, false},
		{"joined once, short: dialled", 0, 0, true, true, true},
		{"turned away, not short", 1, time.Hour, false, false, false},
		{"turned away, short, within the backoff", 1, 100 * time.Millisecond, false, true, false},
		{"turned away, short, past the backoff", 1, 2 * time.Second, false, true, true},
		{"turned away three times, short, within that backoff", 3, 3 * time.Second, true, true, false},
		{"turned away three times, short, past that backoff", 3, 4 * time.Second, true, true, true},
	} {
		if got := joinDueAt(c.sheds, t0.Add(-c.shedAgo), c.joined, c.short, t0, lo, hi); got != c.want {
			t.Errorf("%s: due %v, want %v", c.name, got, c.want)
		}
	}
}

// A seed over its ConnHigh trims its oldest peers. A node it took in
// that still holds TargetPeers does not dial it again (a fleet's first
// joiners would otherwise fill it again at once, a trim cycle a minute);
// once short of peers, it does.
func TestTrimmedJoinPeerIsDialledAgainOnlyWhenShort(t *testing.T) {
	quiet := func(name string) Config {
		c := loopbackConfig(t, name)
		c.ProbeInterval = time.Hour // no probe dials a member
		c.DiscoveryInterval = time.Hour
		c.BackoffMin = 20 * time.Millisecond
		return c
	}
	a, c := startNode(t, quiet("a")), startNode(t, quiet("c"))
	cb := quiet("b")
	cb.Join = []string{tcpAddr(a), tcpAddr(c)}
	cb.TargetPeers = 1
	cb.DiscoveryInterval = 100 * time.Millisecond
	cb.DHT = false // its routing table, low, would dial its bootstrap peers (the join peers) itself
	b := startNode(t, cb)
	// joinState is how b's join of n fares.
	joinState := func(n *Node) string {
		st, err := b.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range st.Joins {
			if j.ID == n.ID().String() {
				return j.State
			}
		}
		return ""
	}
	joined := func(n *Node) bool { return joinState(n) == api.JoinJoined && b.isConnected(n.ID()) }
	waitFor(t, "b to join a and c", func() bool { return joined(a) && joined(c) })

	a.Host().Network().ClosePeer(b.ID()) // a's trim
	// An absence, so a wait: ten of the join loop's rechecks (10 × BackoffMin).
	time.Sleep(10 * 10 * cb.BackoffMin)
	if b.isConnected(a.ID()) {
		t.Fatal("b dialled a again after a trimmed it, though it holds c")
	}
	if st := joinState(a); st != api.JoinDone {
		t.Fatalf("b's join of a, not connected and not dialled, is %q, want %q", st, api.JoinDone)
	}

	if err := c.Close(); err != nil { // b is short now
		t.Fatal(err)
	}
	waitFor(t, "b, short of peers, to dial a again", func() bool { return joined(a) })
}
