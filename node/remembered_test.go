package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

func newPeerID(t *testing.T) peer.ID {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(k)
	return id
}

func TestRememberedSurvivesReloadAndKeepsNewest(t *testing.T) {
	path := filepath.Join(t.TempDir(), rememberedFile)
	r, err := loadRemembered(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	ids := []peer.ID{newPeerID(t), newPeerID(t), newPeerID(t)}
	addr := []ma.Multiaddr{ma.StringCast("/ip4/127.0.0.1/tcp/4001")}
	for i, id := range ids {
		if !r.seen(id, addr, t0.Add(time.Duration(i)*time.Second)) {
			t.Fatalf("peer %d not reported as new", i)
		}
	}
	if r.seen(ids[2], addr, t0.Add(time.Hour)) {
		t.Fatal("known peer reported as new")
	}
	if err := r.save(); err != nil {
		t.Fatal(err)
	}
	again, err := loadRemembered(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	due := again.due(t0, func(peer.ID) bool { return false })
	if len(due) != 2 || due[0].ID != ids[2] || due[1].ID != ids[1] {
		t.Fatalf("due = %v, want the two newest, newest first", due)
	}
	if len(due[0].Addrs) != 1 {
		t.Fatalf("addresses lost: %v", due[0].Addrs)
	}
	// A failed dial defers the peer; a connected one is never due.
	again.failed(ids[1], t0, func(int) time.Duration { return time.Minute })
	due = again.due(t0.Add(time.Second), func(p peer.ID) bool { return p == ids[2] })
	if len(due) != 0 {
		t.Fatalf("due = %v, want none", due)
	}
}

func TestRememberedCorruptFileIsAWarningNotAFailure(t *testing.T) {
	path := filepath.Join(t.TempDir(), rememberedFile)
	os.WriteFile(path, []byte("{not json"), 0o600)
	r, err := loadRemembered(path, 10)
	if err == nil {
		t.Fatal("corrupt file not reported")
	}
	if r == nil || len(r.peers) != 0 {
		t.Fatal("corrupt file should give an empty, usable set")
	}
}

// rememberedIDs are the peers n remembers.
func rememberedIDs(n *Node) map[peer.ID]bool {
	n.remembered.mu.Lock()
	defer n.remembered.mu.Unlock()
	out := map[peer.ID]bool{}
	for id := range n.remembered.peers {
		out[id] = true
	}
	return out
}

// With trusted writers, strangers that say hello are not remembered: they
// pushed the fleet out of peers.json, oldest first.
func TestStrangersDoNotPushRememberedPeersOut(t *testing.T) {
	ca := loopbackConfig(t, "admin")
	ca.Trusted = []string{identity(t, ca).String()}
	admin := startNode(t, ca)
	c := loopbackConfig(t, "b")
	c.Trusted, c.Join, c.MaxRemembered = ca.Trusted, []string{tcpAddr(admin)}, 4
	b := startNode(t, c)
	waitFor(t, "b to remember its trusted seed", func() bool { return rememberedIDs(b)[admin.ID()] })
	for i := range 4 {
		stranger := bareHostConnectedTo(t, b)
		sayHello(t, stranger, b, helloMsg{hello: hello{Name: fmt.Sprint("stranger-", i), Cluster: c.Cluster}}, 1)
		if rememberedIDs(b)[stranger.ID()] {
			t.Fatalf("stranger %d remembered", i)
		}
	}
	if !rememberedIDs(b)[admin.ID()] {
		t.Fatal("the trusted seed was pushed out of the remembered peers")
	}
}

// Remembered peers that do not count (a peers.json from before the trust
// list) are not dialled.
func TestRememberedPeersThatDoNotCountAreNotDialled(t *testing.T) {
	writer, stranger := newPeerID(t), newPeerID(t)
	c := loopbackConfig(t, "b")
	c.Trusted = []string{writer.String()}
	n, err := New(c, Deps{}) // not started: no discovery round dials them first
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	addr := []ma.Multiaddr{ma.StringCast("/ip4/127.0.0.1/tcp/9")}
	n.remembered.seen(writer, addr, time.Unix(1000, 0))
	n.remembered.seen(stranger, addr, time.Unix(2000, 0))
	var got []peer.ID
	for _, ai := range n.rememberedDue() {
		got = append(got, ai.ID)
	}
	if len(got) != 1 || got[0] != writer {
		t.Fatalf("remembered peers due: %v, want only the trusted writer %v", got, writer)
	}
}

// A remembered peer keeps at most maxRememberedAddrs addresses, from its
// connection or from peers.json: identify takes up to 500 of a peer's
// (libp2p's cap), and a member that declared 500 had every agent that
// remembered it write them all and dial them all after each restart.
func TestRememberedAddressesAreBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), rememberedFile)
	r, err := loadRemembered(path, 10)
	if err != nil {
		t.Fatal(err)
	}
	var many []ma.Multiaddr
	for i := range 500 {
		many = append(many, ma.StringCast(fmt.Sprintf("/ip4/10.0.%d.%d/tcp/22", i/250, i%250+1)))
	}
	p := newPeerID(t)
	t0 := time.Unix(1000, 0)
	r.seen(p, many, t0)
	if err := r.save(); err != nil {
		t.Fatal(err)
	}
	again, err := loadRemembered(path, 10)
	if err != nil {
		t.Fatal(err)
	}
	if due := again.due(t0, func(peer.ID) bool { return false }); len(due) != 1 || len(due[0].Addrs) != maxRememberedAddrs {
		t.Fatalf("due = %d peers, want one with %d addresses", len(due), maxRememberedAddrs)
	}
	// A file written otherwise (by hand, an older agent) is bounded too.
	var strs []string
	for _, a := range many {
		strs = append(strs, fmt.Sprintf("%q", a.String()))
	}
	os.WriteFile(path, []byte(`{"peers": [{"id": "`+p.String()+`", "addrs": [`+strings.Join(strs, ",")+`]}]}`), 0o600)
	if again, err = loadRemembered(path, 10); err != nil {
		t.Fatal(err)
	}
	if due := again.due(t0, func(peer.ID) bool { return false }); len(due) != 1 || len(due[0].Addrs) != maxRememberedAddrs {
		t.Fatalf("from a file: due = %d peers, want one with %d addresses", len(due), maxRememberedAddrs)
	}
}
