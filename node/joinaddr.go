package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	pnetconn "github.com/libp2p/go-libp2p/p2p/net/pnet"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	ma "github.com/multiformats/go-multiaddr"
	mss "github.com/multiformats/go-multistream"
)

// joinTarget is one --join address: where to dial, and whom if the
// address says.
type joinTarget struct {
	given string       // as the operator wrote it
	addr  ma.Multiaddr // without /p2p; nil for a bare /p2p/<peer-id>
	id    peer.ID      // empty: learnt on each connect by learnPeerID
}

func (t joinTarget) addrInfo(id peer.ID) peer.AddrInfo {
	ai := peer.AddrInfo{ID: id}
	if t.addr != nil {
		ai.Addrs = []ma.Multiaddr{t.addr}
	}
	return ai
}

const joinForms = "use HOST:PORT, a TCP multiaddr such as /ip4/10.0.0.1/tcp/4001 or /dns/host.example/tcp/4001, or any address from `tribe status` on that host (with /p2p/<peer-id>)"

// parseJoin parses a --join address: HOST:PORT (Serf's form; the host an
// IP or a DNS name), a multiaddr with /p2p/<peer-id>, or a TCP multiaddr
// without it.
func parseJoin(s string) (joinTarget, error) {
	if !strings.HasPrefix(s, "/") {
		a, err := hostPortAddr(s)
		if err != nil {
			return joinTarget{}, fmt.Errorf("join address %q: %v; %s", s, err, joinForms)
		}
		return joinTarget{given: s, addr: a}, nil
	}
	a, err := ma.NewMultiaddr(s)
	if err != nil {
		return joinTarget{}, fmt.Errorf("join address %q: %v; %s", s, err, joinForms)
	}
	addr, id := peer.SplitAddr(a)
	if id != "" {
		return joinTarget{given: s, addr: addr, id: id}, nil
	}
	if !isPlainTCP(a) {
		return joinTarget{}, fmt.Errorf("join address %q has no /p2p/<peer-id>: without one only a TCP address (/ip4, /ip6, /dns, /dns4 or /dns6, then /tcp/PORT) can be joined, as the peer's ID is learnt in the TCP handshake", s)
	}
	return joinTarget{given: s, addr: a}, nil
}

// hostPortAddr turns HOST:PORT into a TCP multiaddr.
func hostPortAddr(s string) (ma.Multiaddr, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return nil, err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nil, fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	var proto string
	switch ip := net.ParseIP(host); {
	case ip == nil:
		if !dnsNameOK(host) {
			return nil, fmt.Errorf("host %q is neither an IP address nor a DNS name", host)
		}
		proto = "dns" // either family, as the name resolves
	case ip.To4() != nil:
		proto = "ip4"
	default:
		proto = "ip6"
	}
	return ma.NewMultiaddr("/" + proto + "/" + host + "/tcp/" + port)
}

func dnsNameOK(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}

// isPlainTCP reports whether a is exactly an IP or DNS address then /tcp.
func isPlainTCP(a ma.Multiaddr) bool {
	if len(a) != 2 || a[1].Code() != ma.P_TCP {
		return false
	}
	switch a[0].Code() {
	case ma.P_IP4, ma.P_IP6, ma.P_DNS, ma.P_DNS4, ma.P_DNS6:
		return true
	}
	return false
}

// tcpDialArgs is the network and host:port of a plain TCP multiaddr.
func tcpDialArgs(a ma.Multiaddr) (network, hostport string, err error) {
	if !isPlainTCP(a) {
		return "", "", fmt.Errorf("%s is not a TCP address", a)
	}
	network = "tcp"
	switch a[0].Code() {
	case ma.P_IP4, ma.P_DNS4:
		network = "tcp4"
	case ma.P_IP6, ma.P_DNS6:
		network = "tcp6"
	}
	return network, net.JoinHostPort(a[0].Value(), a[1].Value()), nil
}

// learnPeerID finds out who listens on a TCP address. libp2p dials only
// a known peer ID (the upgrader refuses an outbound connection without one),
// so it runs the start of a libp2p connection itself: the swarm key's
// protector if any, multistream-select of Noise, and a Noise handshake that
// accepts any remote key. The handshake proves the remote holds the key of
// the ID it returns; then the connection is closed, and the swarm dials
// that ID as usual, checking it again.
//
// Like Serf's -join HOST:PORT, this trusts whoever answers at the address
// to be the peer meant; with a full /p2p address a different peer there
// fails the dial. Either way, what a peer may do is decided by the trust
// list, not by how it was found.
func learnPeerID(ctx context.Context, addr ma.Multiaddr, key crypto.PrivKey, psk pnet.PSK) (peer.ID, error) {
	network, hostport, err := tcpDialArgs(addr)
	if err != nil {
		return "", err
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, network, hostport)
	if err != nil {
		return "", err
	}
	defer raw.Close()
	// The handshake steps below block on the connection, not on ctx.
	stop := context.AfterFunc(ctx, func() { raw.Close() })
	defer stop()
	var conn net.Conn = raw
	if psk != nil {
		if conn, err = pnetconn.NewProtectedConn(psk, raw); err != nil {
			return "", fmt.Errorf("swarm key: %w", err)
		}
	}
	if err := mss.SelectProtoOrFail(noise.ID, conn); err != nil {
		return "", fmt.Errorf("%w: negotiating noise: %v", errNotLibp2p, err)
	}
	nt, err := noise.New(noise.ID, key, nil)
	if err != nil {
		return "", err
	}
	st, err := nt.WithSessionOptions(noise.DisablePeerIDCheck())
	if err != nil {
		return "", err
	}
	sc, err := st.SecureOutbound(ctx, conn, "")
	if err != nil {
		return "", fmt.Errorf("noise handshake: %w", err)
	}
	sc.Close()
	return sc.RemotePeer(), nil
}

// errNotLibp2p: something listens there, but not a libp2p peer (or one
// with another swarm key, whose protector garbles the exchange).
var errNotLibp2p = errors.New("no libp2p peer answers there (or it has another swarm key)")
