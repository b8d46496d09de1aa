package node

import (
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	ma "github.com/multiformats/go-multiaddr"
)

// tcpFallback is how long after its last TCP dial began the node waits
// before it also dials a peer's other addresses (QUIC), if that dial has
// neither connected nor failed (a failed dial moves on to the next address
// at once). Long enough that a host busy with handshakes does not start a
// second one to the same peer, the costlier kind; short enough next to
// the 10 s a TCP dial may take where a firewall drops it.
const tcpFallback = 2 * time.Second

// tcpFirst ranks a peer's addresses for dialling: its TCP addresses first,
// in the swarm's default order among them, and the rest (QUIC) only if no
// TCP dial has connected tcpFallback after the last one began; a peer with
// no TCP address is dialled over QUIC at once.
//
// The swarm's default ranker prefers QUIC, and QUIC costs more here: its
// acknowledgements, timers and encryption run in the process, per packet
// and per connection, where TCP leaves them to the kernel. Measured with
// real agents on loopback (two cores): 50 agents idled at 365 ms of CPU a
// minute each over QUIC and 285 over TCP; 100 agents over QUIC never
// settled (both cores busy for minutes, 1.2 s a minute each), over TCP
// they all listed each other alive and then idled at 353 ms a minute.
func tcpFirst(addrs []ma.Multiaddr) []network.AddrDelay {
	var tcp, other []ma.Multiaddr
	for _, a := range addrs {
		if isTCP(a) {
			tcp = append(tcp, a)
		} else {
			other = append(other, a)
		}
	}
	ranked := swarm.DefaultDialRanker(tcp)
	var shift time.Duration
	if len(ranked) > 0 {
		for _, r := range ranked {
			shift = max(shift, r.Delay)
		}
		shift += tcpFallback
	}
	for _, r := range swarm.DefaultDialRanker(other) {
		r.Delay += shift
		ranked = append(ranked, r)
	}
	return ranked
}

// isTCP reports whether a is a plain TCP address (no websocket or other
// layer above the TCP port).
func isTCP(a ma.Multiaddr) bool {
	last := ""
	for _, c := range a {
		if c.Protocol().Code == ma.P_P2P {
			break
		}
		last = c.Protocol().Name
	}
	return last == "tcp"
}
