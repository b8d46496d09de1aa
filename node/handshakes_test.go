package node

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	ma "github.com/multiformats/go-multiaddr"
)

func TestSourceOf(t *testing.T) {
	for _, c := range []struct {
		addr string
		want string // "" for none
	}{
		{"/ip4/203.0.113.7/tcp/4001", "203.0.113.7/32"},
		{"/ip4/127.0.0.1/udp/4001/quic-v1", "127.0.0.1/32"},
		{"/ip6/2001:db8:1:2ff:aaaa::1/tcp/4001", "2001:db8:1:200::/56"},
		{"/ip6/2001:db8:1:2ee::9/tcp/4001", "2001:db8:1:200::/56"},
		{"/ip6/::ffff:198.51.100.2/tcp/4001", "198.51.100.2/32"},
		{"/dns4/example.com/tcp/4001", ""},
	} {
		got, ok := sourceOf(ma.StringCast(c.addr))
		if c.want == "" {
			if ok {
				t.Errorf("%s: source %s, want none", c.addr, got)
			}
			continue
		}
		if !ok || got != netip.MustParsePrefix(c.want) {
			t.Errorf("%s: source %s (%v), want %s", c.addr, got, ok, c.want)
		}
	}
}

func TestHandshakeGuardCapsOneSource(t *testing.T) {
	base, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(rcmgr.InfiniteLimits))
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	g := newHandshakeGuard(base, 2)
	from := ma.StringCast("/ip4/203.0.113.7/tcp/5555")
	src, _ := sourceOf(from)
	open := func(dir network.Direction, a ma.Multiaddr) (network.ConnManagementScope, error) {
		return g.OpenConnection(dir, true, a)
	}
	first, err1 := open(network.DirInbound, from)
	second, err2 := open(network.DirInbound, from)
	if err1 != nil || err2 != nil {
		t.Fatalf("within the cap: %v, %v", err1, err2)
	}
	if _, err := open(network.DirInbound, from); !errors.Is(err, errTooManyHandshakes) {
		t.Fatalf("over the cap: %v, want %v", err, errTooManyHandshakes)
	}
	// Another source, and our own dials, are not held back.
	other, err := open(network.DirInbound, ma.StringCast("/ip4/203.0.113.8/tcp/5555"))
	if err != nil {
		t.Fatalf("another source: %v", err)
	}
	other.Done()
	out, err := open(network.DirOutbound, from)
	if err != nil {
		t.Fatalf("outbound: %v", err)
	}
	out.Done()

	// A handshake that names its peer frees its place; the connection
	// ending later does not free it twice.
	if err := first.SetPeer(peer.ID("peer-a")); err != nil {
		t.Fatal(err)
	}
	if got := g.inHandshake(src); got != 1 {
		t.Fatalf("in the handshake after SetPeer: %d, want 1", got)
	}
	first.Done()
	if got := g.inHandshake(src); got != 1 {
		t.Fatalf("in the handshake after Done of an authenticated connection: %d, want 1", got)
	}
	// A handshake that fails frees its place too.
	second.Done()
	second.Done()
	if got := g.inHandshake(src); got != 0 {
		t.Fatalf("in the handshake after all ended: %d, want 0", got)
	}
	for range 2 {
		s, err := open(network.DirInbound, from)
		if err != nil {
			t.Fatalf("after the places were freed: %v", err)
		}
		defer s.Done()
	}
}

// A connection refused for its source's share of handshakes is counted,
// under rejected in tribe status, as every refusal of a stranger's is.
func TestHandshakesRefusedAreCounted(t *testing.T) {
	n := startNode(t, loopbackConfig(t, "a"))
	rm := n.host.Network().ResourceManager()
	from := ma.StringCast("/ip4/203.0.113.7/tcp/5555")
	for range handshakesPerIP {
		s, err := rm.OpenConnection(network.DirInbound, true, from)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Done()
	}
	if _, err := rm.OpenConnection(network.DirInbound, true, from); !errors.Is(err, errTooManyHandshakes) {
		t.Fatalf("over the cap: %v", err)
	}
	if got := n.rejected()["handshakes_refused"]; got != 1 {
		t.Fatalf("handshakes_refused = %d, want 1", got)
	}
}
