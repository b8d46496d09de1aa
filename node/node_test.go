package node

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/keys"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins"
)

// loopbackConfig is a real agent's config on loopback with mDNS off.
func loopbackConfig(t testing.TB, name string) Config {
	c := DefaultConfig()
	c.Name = name
	c.DataDir = t.TempDir()
	c.MDNS = false
	c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"}
	c.BackoffMin = 50 * time.Millisecond
	return c
}

func startNode(t testing.TB, c Config) *Node {
	t.Helper()
	return startNodeDeps(t, c, Deps{})
}

// tcpAddr is n's full TCP address, for --join.
func tcpAddr(n *Node) string {
	for _, s := range p2pAddrs(n.ID(), n.Host().Addrs()) {
		if strings.Contains(s, "/tcp/") {
			return s
		}
	}
	return ""
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestTwoRealNodesJoinAndNameEachOther(t *testing.T) {
	a := startNode(t, loopbackConfig(t, "a"))
	cb := loopbackConfig(t, "b")
	cb.Join = []string{tcpAddr(a)}
	b := startNode(t, cb)
	waitFor(t, "a and b to see each other", func() bool {
		return len(a.ConnectedPeers()) == 1 && len(b.ConnectedPeers()) == 1
	})
	peers, err := a.Peers(context.Background())
	if err != nil || len(peers) != 1 || peers[0].Name != "b" || peers[0].ID != b.ID().String() || len(peers[0].Addrs) == 0 {
		t.Fatalf("a's peers: %+v, %v", peers, err)
	}
	st, _ := b.Status(context.Background())
	if st.Peers != 1 || st.Name != "b" || st.ID != b.ID().String() {
		t.Fatalf("b's status: %+v", st)
	}
	// b remembers a on disk as soon as it met it (its first peer: no
	// batching with others).
	waitFor(t, "b to write a to peers.json", func() bool {
		raw, err := os.ReadFile(filepath.Join(cb.DataDir, rememberedFile))
		return err == nil && strings.Contains(string(raw), a.ID().String())
	})
}

func TestPeersOfAnotherClusterAreNotListed(t *testing.T) {
	a := startNode(t, loopbackConfig(t, "a"))
	cb := loopbackConfig(t, "b")
	cb.Cluster = "other"
	cb.Join = p2pAddrs(a.ID(), a.Host().Addrs())[:1]
	b := startNode(t, cb)
	waitFor(t, "a to hear b's hello", func() bool { _, ok := a.peers.get(b.ID()); return ok })
	if got := a.ConnectedPeers(); len(got) != 0 {
		t.Fatalf("a lists a peer of another cluster: %v", got)
	}
}

func TestDataDirIsExclusive(t *testing.T) {
	c := loopbackConfig(t, "a")
	n, err := New(c, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, err := New(c, Deps{}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second node on one data dir: %v", err)
	}
}

func TestRunServesTheAPIAndRemovesTheSocket(t *testing.T) {
	c := loopbackConfig(t, "a")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan *Node, 1)
	go func() { done <- Run(ctx, c, Deps{Logger: testLogger(t)}, func(n *Node) { ready <- n }) }()
	var n *Node
	select {
	case n = <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	sock := filepath.Join(c.DataDir, api.SocketName)
	st, err := os.Stat(sock)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v, mode %v", err, st.Mode())
	}
	got, err := api.NewClient(sock).Status(context.Background())
	if err != nil || got.ID != n.ID().String() {
		t.Fatalf("status over the socket: %+v, %v", got, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v", err)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
}

func TestSwarmKeyKeepsOutsidersOut(t *testing.T) {
	dir := t.TempDir()
	writeKey := func(name string, b byte) string {
		var k [32]byte
		for i := range k {
			k[i] = b
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, keys.FormatSwarmKey(k), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	fleetKey, otherKey := writeKey("fleet.key", 1), writeKey("other.key", 2)
	private := func(name, key string) Config {
		c := loopbackConfig(t, name)
		c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
		c.SwarmKeyFile = key
		return c
	}
	a := startNode(t, private("a", fleetKey))
	join := p2pAddrs(a.ID(), a.Host().Addrs())[0]

	cb := private("b", fleetKey)
	cb.Join = []string{join}
	b := startNode(t, cb)
	waitFor(t, "b to join a over the private network", func() bool { return len(b.ConnectedPeers()) == 1 })
	if st, _ := b.Status(context.Background()); !st.Private {
		t.Fatal("status does not say the network is private")
	}

	for _, key := range []string{otherKey, ""} {
		c := private("outsider", key)
		n := startNode(t, c)
		err := n.connect(peerAddrInfo(t, join))
		if err == nil {
			t.Fatalf("a node with swarm key %q connected to the private network", key)
		}
		n.Close()
	}
}

func peerAddrInfo(t *testing.T, s string) peer.AddrInfo {
	t.Helper()
	j, err := parseJoin(s)
	if err != nil || j.id == "" {
		t.Fatalf("%s: %v", s, err)
	}
	return j.addrInfo(j.id)
}

// A damaged state store stops the node with the error that says what to
// do, not a panic; moved aside, the node starts with a new one.
func TestDamagedStateStoreIsAnError(t *testing.T) {
	c := loopbackConfig(t, "a")
	n := startNode(t, c)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(c.DataDir, gossip.StoreFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 5))
	for i := 2 * os.Getpagesize(); i < len(b); i++ { // every page but the two meta pages
		b[i] = byte(rng.Uint32())
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(c, Deps{}); !errors.Is(err, gossip.ErrCorruptStore) || !strings.Contains(err.Error(), "move it aside") {
		t.Fatalf("New over a damaged store: %v", err)
	}
	if err := os.Rename(path, path+".damaged"); err != nil {
		t.Fatal(err)
	}
	n = startNode(t, c) // the data dir and its lock were released
	if _, ok := n.nodeRecords()[n.ID()]; !ok {
		t.Fatal("the node did not write its record into a new store")
	}
}

// Every protocol the node serves is served once Start returns, not once
// the loop that uses it has started: a peer that dialled a starting node
// at once was told the protocol is not supported.
func TestProtocolsServedOnceStarted(t *testing.T) {
	for range 5 {
		n := startNode(t, loopbackConfig(t, "a"))
		have := n.host.Mux().Protocols()
		for _, p := range []protocol.ID{JobProtocol, JobOutputProtocol, JobListProtocol, PluginFetchProtocol, TaskWatchProtocol, plugins.ProtocolID, plugins.RelayProtocol} {
			if !slices.Contains(have, p) {
				t.Fatalf("%s not served when Start returned", p)
			}
		}
		n.Close()
	}
}

// A data dir others can write is refused: they could replace the state,
// the plugins and the control socket.
func TestDataDirOthersCanWriteIsRefused(t *testing.T) {
	c := loopbackConfig(t, "a")
	if err := os.Chmod(c.DataDir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := New(c, Deps{}); err == nil || !strings.Contains(err.Error(), "writable by group or others") {
		t.Fatalf("a world-writable data dir: %v", err)
	}
	os.Chmod(c.DataDir, 0o755)
	n, err := New(c, Deps{})
	if err != nil {
		t.Fatalf("a data dir others can read: %v", err)
	}
	n.Close()
}
