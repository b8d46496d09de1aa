package node

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// listeningHost is a bare libp2p host on loopback TCP, closed when the
// test ends.
func listeningHost(t *testing.T) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// sayBusy has h tell n, times times, that it is busy and n should go to
// target instead (maxReferrals referrals naming it).
func sayBusy(t *testing.T, h host.Host, n *Node, target host.Host, times int) {
	t.Helper()
	ref := p2pAddrs(target.ID(), target.Addrs())[0]
	refs := make([]string, maxReferrals)
	for i := range refs {
		refs[i] = ref
	}
	sayHello(t, h, n, helloMsg{hello: hello{Name: "busy", Cluster: n.cfg.Cluster, Busy: true}, Referrals: refs}, times)
}

// sayHello has h send n the hello m, times times, each handled in full
// before the next.
func sayHello(t *testing.T, h host.Host, n *Node, m helloMsg, times int) {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	for range times {
		s, err := h.NewStream(context.Background(), n.ID(), HelloProtocol)
		if err != nil {
			t.Fatal(err)
		}
		s.Write(append(b, '\n'))
		if _, err := readHello(s); err != nil {
			t.Fatal(err)
		}
		s.Close()
		// The node takes the hello after answering it, and ends the
		// stream once it has.
		waitFor(t, "the node to take the hello", func() bool { return streamsWith(n, h.ID(), HelloProtocol) == 0 })
	}
}

// Busy answers this node's dial: a stranger that dialled in and says busy,
// naming some address, must not make the node dial it (it made a node dial
// one address 160 times for 20 hellos).
func TestBusyHelloFromAPeerThatDialledInIsIgnored(t *testing.T) {
	n := startNode(t, loopbackConfig(t, "victim"))
	stranger := bareHostConnectedTo(t, n)
	target := listeningHost(t)
	sayBusy(t, stranger, n, target, 20)
	if got := n.sheds.notDialled.Load(); got != 20 {
		t.Fatalf("busy hellos refused: %d, want 20", got)
	}
	if got := n.sheds.follows.Load(); got != 0 {
		t.Fatalf("busy answers followed: %d, want 0", got)
	}
	if st, _ := n.Status(t.Context()); st.Rejected["busy_not_dialled"] != 20 {
		t.Fatalf("status counts %d busy hellos refused, want 20", st.Rejected["busy_not_dialled"])
	}
}

// A busy peer this node dialled is followed once per interval, however
// often it says so, and the node it names is dialled.
func TestBusyAnswerIsFollowedOncePerPeer(t *testing.T) {
	n := startNode(t, loopbackConfig(t, "joiner"))
	seed := listeningHost(t)
	if err := n.Host().Connect(context.Background(), peer.AddrInfo{ID: seed.ID(), Addrs: seed.Addrs()}); err != nil {
		t.Fatal(err)
	}
	target := listeningHost(t)
	sayBusy(t, seed, n, target, 20)
	if got := n.sheds.follows.Load(); got != 1 {
		t.Fatalf("busy answers followed: %d, want 1", got)
	}
	waitFor(t, "the joiner to dial the node it was sent to", func() bool {
		return target.Network().Connectedness(n.ID()) == network.Connected
	})
}
