package node

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// errTooManyHandshakes refuses an inbound connection from a source that
// already has its share of connections in the handshake.
var errTooManyHandshakes = errors.New("node: too many connections from this address in the handshake")

// handshakeGuard is the resource manager with one more limit: how many
// inbound connections one source (an IPv4 address, an IPv6 /56) may have
// in the handshake at once. libp2p caps connections per address whatever
// their state; this caps the unauthenticated ones, which cost an attacker
// nothing, so that one address cannot take the whole handshake budget.
//
// A connection counts from the accept until the handshake names its peer
// (SetPeer) or it ends (Done), whichever comes first. Both TCP and QUIC
// open their inbound connections through OpenConnection.
type handshakeGuard struct {
	network.ResourceManager
	limit int

	mu     sync.Mutex
	counts map[netip.Prefix]int

	refused atomic.Int64 // connections refused for their source's share: handshakes_refused
}

func newHandshakeGuard(rm network.ResourceManager, limit int) *handshakeGuard {
	return &handshakeGuard{ResourceManager: rm, limit: limit, counts: map[netip.Prefix]int{}}
}

func (g *handshakeGuard) OpenConnection(dir network.Direction, usefd bool, endpoint ma.Multiaddr) (network.ConnManagementScope, error) {
	src, ok := sourceOf(endpoint)
	if dir != network.DirInbound || !ok {
		return g.ResourceManager.OpenConnection(dir, usefd, endpoint)
	}
	if !g.acquire(src) {
		g.refused.Add(1)
		return nil, fmt.Errorf("%w (%s, at most %d)", errTooManyHandshakes, src, g.limit)
	}
	scope, err := g.ResourceManager.OpenConnection(dir, usefd, endpoint)
	if err != nil {
		g.release(src)
		return nil, err
	}
	return &handshakingScope{ConnManagementScope: scope, done: sync.OnceFunc(func() { g.release(src) })}, nil
}

func (g *handshakeGuard) acquire(src netip.Prefix) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.counts[src] >= g.limit {
		return false
	}
	g.counts[src]++
	return true
}

func (g *handshakeGuard) release(src netip.Prefix) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.counts[src]--; g.counts[src] <= 0 {
		delete(g.counts, src)
	}
}

// inHandshake reports how many connections src has in the handshake.
func (g *handshakeGuard) inHandshake(src netip.Prefix) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.counts[src]
}

// sourceOf is the source an inbound connection from endpoint counts
// against: its IPv4 address, or its IPv6 address's /56.
func sourceOf(endpoint ma.Multiaddr) (netip.Prefix, bool) {
	if endpoint == nil {
		return netip.Prefix{}, false
	}
	ip, err := manet.ToIP(endpoint)
	if err != nil {
		return netip.Prefix{}, false
	}
	addr, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Prefix{}, false
	}
	addr = addr.Unmap()
	bits := 32
	if addr.Is6() {
		bits = ipv6SourcePrefix
	}
	p, err := addr.Prefix(bits)
	return p, err == nil
}

// handshakingScope is a connection's scope that tells the guard when the
// handshake is over.
type handshakingScope struct {
	network.ConnManagementScope
	done func() // idempotent
}

func (s *handshakingScope) SetPeer(p peer.ID) error {
	err := s.ConnManagementScope.SetPeer(p)
	s.done()
	return err
}

func (s *handshakingScope) Done() {
	s.done()
	s.ConnManagementScope.Done()
}
