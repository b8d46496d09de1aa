package node

import (
	"cmp"
	"math"
	"net/netip"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/protocol"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/x/rate"

	"github.com/tribeagent/tribe/plugins"
)

// The handshake limits do not depend on the fleet: they bound what
// strangers who have not proved an identity may hold.
const (
	// handshakeTimeout bounds an inbound connection from its accept to
	// secured and multiplexed, and dialTimeout an outbound one from the
	// connect (libp2p's defaults; its dial deadline on a LAN is 5 s). A
	// handshake takes a few round trips, milliseconds of CPU on each end;
	// but on a host whose CPU is starved each round trip waits for both
	// processes to be scheduled: on a 200-agent fleet melted on 2 cores a
	// handshake took 5 s and more, so every dial timed out at 5 s and was
	// made again from the start, and a fan-out's calls to hosts it held
	// no connection to stopped answering a minute in (89 of 159, none
	// after 60 s; 146 of 167 with 15 s). A socket silent for this long
	// is an attack or a dead host, and is closed; the handshake budget
	// below (its own, per source) keeps such sockets from shutting out
	// others.
	handshakeTimeout = 15 * time.Second
	dialTimeout      = 15 * time.Second
	// requestTimeout bounds the small request a stream of the agent's
	// own protocols (job lists and outputs, task watches) starts with.
	requestTimeout = 5 * time.Second
	// firstRequestTimeout bounds, tighter, the wait for the request line
	// of a stream that takes a slot before it reads it (job lists and
	// outputs): an honest peer writes its line as the stream opens, and
	// one that sends nothing held its slot for requestTimeout, so four
	// admitted peers could block every job list.
	firstRequestTimeout = 2 * time.Second
	// handshakes caps the inbound connections in the handshake at once,
	// from everyone; libp2p's default is 32, which 33 silent sockets fill.
	handshakes = 512
	// handshakesPerIP caps those from one IPv4 address or IPv6 /56, so one
	// source takes at most an eighth of the budget. Agents behind one NAT
	// share it, but each handshake lasts milliseconds: 64 at the same
	// instant is far above what a site full of booting hosts makes. Tests
	// on loopback share 127.0.0.1 and must stay below it too.
	handshakesPerIP = 64
	// ipv6SourcePrefix is how much of an IPv6 address names one source
	// (libp2p's per-subnet limits use /56 too): one host usually holds a
	// whole /64.
	ipv6SourcePrefix = 56
)

// yamuxStreamWindow is what yamux reserves in the resource manager for
// every stream it opens or accepts (its initial receive window). If a
// peer's or the system's memory limit runs out first, yamux closes the
// whole connection instead of refusing one stream; so memory limits are
// set to streams × window, and the stream counts bind first.
const yamuxStreamWindow = 256 << 10

// hostLimits are the limits of an agent's libp2p host, in one table.
// limitsFor derives them from the configuration; resourceLimits turns them
// into the resource manager's, and buildHost applies the rest.
//
// The connection manager, not these limits, decides who stays connected:
// it trims to ConnLow when over ConnHigh, keeping protected and tagged
// peers. These limits sit well above ConnHigh so that they only stop what
// the connection manager cannot (floods faster than its trim, silent
// sockets that never become peers).
type hostLimits struct {
	// HandshakeTimeout, DialTimeout, Handshakes and HandshakesPerIP: see
	// the constants.
	HandshakeTimeout time.Duration
	DialTimeout      time.Duration
	Handshakes       int
	HandshakesPerIP  int

	// Inbound and Outbound cap the established connections each way.
	// Inbound is on top of Handshakes: silent sockets never take an
	// established connection's place.
	Inbound, Outbound int
	// PerIP caps the connections with one IPv4 address or IPv6 /56, both
	// ways, established or not (libp2p's default of 8 would shut out the
	// ninth agent behind a NAT); PerIPRate is how many new ones per second
	// it may open after a burst of PerIP. Loopback is not limited.
	PerIP     int
	PerIPRate float64

	// PeerStreams caps one peer's streams each way and PeerStreamsAll
	// both ways together; CallStreams caps its streams of the call
	// protocol each way (see plugins.CallStreamsPerPeer).
	PeerStreams, PeerStreamsAll, CallStreams int
	// Streams caps all streams each way, StreamsAll both ways together.
	Streams, StreamsAll int
	// AllCallStreams caps the call protocol's streams each way, all peers
	// together: below Streams, so that calls (a flood of them, or
	// strangers' streams waiting for a request) never take the streams a
	// probe, a sync or a hand-off needs.
	AllCallStreams int
}

// limitsFor returns the limits of an agent with configuration c.
//
// With the default ConnHigh of 128 (fleets up to 5,000 hosts):
//
//	handshake deadline            15 s each way
//	in the handshake              512, at most 64 per IPv4 address or IPv6 /56
//	established inbound           1,024   8 × ConnHigh
//	established outbound          1,024   8 × ConnHigh
//	per address (both ways)       256     2 × ConnHigh (or ConnsPerIP), 10 new per second after that burst
//	streams per peer              384 each way, 512 in all; 256 each way of the call protocol
//	streams in all                2,048 each way, 4,096 in all (transient ones too); 1,536 each way of the call protocol
//	file descriptors              2,560   every connection, handshakes included
//	memory (yamux windows)        128 MiB per peer, 1 GiB in all: accounted, not allocated
//
// Eight times ConnHigh leaves room for a minute of newcomers (the
// connection manager spares connections younger than its one-minute grace
// period), as when a fleet boots against a few --join seeds.
func limitsFor(c Config) hostLimits {
	return hostLimits{
		HandshakeTimeout: handshakeTimeout,
		DialTimeout:      dialTimeout,
		Handshakes:       handshakes,
		HandshakesPerIP:  handshakesPerIP,
		Inbound:          8 * c.ConnHigh,
		Outbound:         8 * c.ConnHigh,
		PerIP:            cmp.Or(c.ConnsPerIP, 2*c.ConnHigh),
		PerIPRate:        10,
		PeerStreams:      plugins.CallStreamsPerPeer + 128,
		PeerStreamsAll:   2 * plugins.CallStreamsPerPeer,
		CallStreams:      plugins.CallStreamsPerPeer,
		Streams:          2048,
		StreamsAll:       4096,
		AllCallStreams:   1536,
	}
}

// FDs is how many file descriptors the host may use for connections; the
// process needs that many more than it uses for anything else.
func (l hostLimits) FDs() int { return l.Handshakes + l.Inbound + l.Outbound }

// fdHeadroom is what the agent keeps open besides connections (the store,
// the API socket, listeners, plugins' pipes), with room to spare.
const fdHeadroom = 256

// openFileLimit is the process's soft limit on open files (Go raises it
// to the hard limit at start), or 0 if it cannot tell.
func openFileLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	return r.Cur
}

// resourceLimits is the resource manager's configuration for l. Scopes the
// table does not mention (services, other protocols, a single connection
// or stream) keep libp2p's defaults for a 128 MiB host.
func (l hostLimits) resourceLimits() rcmgr.ConcreteLimitConfig {
	mem := func(streams int) rcmgr.LimitVal64 { return rcmgr.LimitVal64(int64(streams) * yamuxStreamWindow) }
	val := func(n int) rcmgr.LimitVal { return rcmgr.LimitVal(n) }
	partial := rcmgr.PartialLimitConfig{
		System: rcmgr.ResourceLimits{
			ConnsInbound:    val(l.Inbound + l.Handshakes),
			ConnsOutbound:   val(l.Outbound),
			Conns:           val(l.FDs()),
			FD:              val(l.FDs()),
			StreamsInbound:  val(l.Streams),
			StreamsOutbound: val(l.Streams),
			Streams:         val(l.StreamsAll),
			Memory:          mem(l.StreamsAll),
		},
		// Connections stay transient until the handshake names the peer
		// (outbound ones only for a moment: the dialler knows whom it
		// dials); streams, until their protocol is negotiated.
		Transient: rcmgr.ResourceLimits{
			ConnsInbound:    val(l.Handshakes),
			ConnsOutbound:   val(l.Outbound),
			Conns:           val(l.Handshakes + l.Outbound),
			FD:              val(l.Handshakes + l.Outbound),
			StreamsInbound:  val(l.Streams),
			StreamsOutbound: val(l.Streams),
			Streams:         val(l.StreamsAll),
		},
		PeerDefault: rcmgr.ResourceLimits{
			StreamsInbound:  val(l.PeerStreams),
			StreamsOutbound: val(l.PeerStreams),
			Streams:         val(l.PeerStreamsAll),
			Memory:          mem(l.PeerStreamsAll),
		},
		ProtocolPeer: map[protocol.ID]rcmgr.ResourceLimits{
			plugins.ProtocolID: {
				StreamsInbound:  val(l.CallStreams),
				StreamsOutbound: val(l.CallStreams),
				Streams:         val(2 * l.CallStreams),
			},
		},
		Protocol: map[protocol.ID]rcmgr.ResourceLimits{
			plugins.ProtocolID: {
				StreamsInbound:  val(l.AllCallStreams),
				StreamsOutbound: val(l.AllCallStreams),
				Streams:         val(2 * l.AllCallStreams),
			},
		},
	}
	return partial.Build(rcmgr.DefaultLimits.Scale(128<<20, l.FDs()))
}

// resourceOptions are the resource manager's per-address limits for l.
func (l hostLimits) resourceOptions() []rcmgr.Option {
	unlimited := func(prefix string) rcmgr.NetworkPrefixLimit {
		return rcmgr.NetworkPrefixLimit{Network: netip.MustParsePrefix(prefix), ConnCount: math.MaxInt}
	}
	perIP := rate.Limit{RPS: l.PerIPRate, Burst: l.PerIP}
	return []rcmgr.Option{
		rcmgr.WithNetworkPrefixLimit(
			[]rcmgr.NetworkPrefixLimit{unlimited("127.0.0.0/8")},
			[]rcmgr.NetworkPrefixLimit{unlimited("::1/128")}),
		rcmgr.WithLimitPerSubnet(
			[]rcmgr.ConnLimitPerSubnet{{PrefixLength: 32, ConnCount: l.PerIP}},
			[]rcmgr.ConnLimitPerSubnet{{PrefixLength: ipv6SourcePrefix, ConnCount: l.PerIP}}),
		rcmgr.WithConnRateLimiters(&rate.Limiter{
			NetworkPrefixLimits: []rate.PrefixLimit{
				{Prefix: netip.MustParsePrefix("127.0.0.0/8")},
				{Prefix: netip.MustParsePrefix("::1/128")},
			},
			SubnetRateLimiter: rate.SubnetLimiter{
				IPv4SubnetLimits: []rate.SubnetLimit{{PrefixLength: 32, Limit: perIP}},
				IPv6SubnetLimits: []rate.SubnetLimit{{PrefixLength: ipv6SourcePrefix, Limit: perIP}},
				GracePeriod:      time.Minute,
			},
		}),
	}
}
