package node

import (
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/core/sec"
	bhost "github.com/libp2p/go-libp2p/p2p/host/basic"
	"github.com/libp2p/go-libp2p/p2p/host/eventbus"
	"github.com/libp2p/go-libp2p/p2p/host/peerstore/pstoremem"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	tptu "github.com/libp2p/go-libp2p/p2p/net/upgrader"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	tls "github.com/libp2p/go-libp2p/p2p/security/tls"
	quic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/quicreuse"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	goyamux "github.com/libp2p/go-yamux/v5"
	quicgo "github.com/quic-go/quic-go"
)

// buildHost assembles the libp2p host of a real agent from its parts: a
// swarm with TCP and QUIC, Noise and TLS, yamux, a connection manager and a
// resource manager with the limits of limitsFor (limits.go), under a basic
// host with identify and ping. It does not listen yet: Start opens the
// listeners.
//
// It does not go through libp2p.New on purpose. That constructor links in
// every transport libp2p has (WebRTC with the pion stack, WebTransport,
// WebSocket) and starts AutoNAT with a second dial-back host, none of which a
// fleet agent uses; leaving them out makes the binary smaller and the idle
// agent lighter (see `make bench`).
func buildHost(cfg Config, key crypto.PrivKey, psk pnet.PSK) (_ host.Host, err error) {
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("node: identity: %w", err)
	}
	var closers []func() error
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}
	}()

	ps, err := pstoremem.NewPeerstore()
	if err != nil {
		return nil, fmt.Errorf("node: peerstore: %w", err)
	}
	closers = append(closers, ps.Close)
	if err := ps.AddPrivKey(id, key); err != nil {
		return nil, fmt.Errorf("node: peerstore: %w", err)
	}
	if err := ps.AddPubKey(id, key.GetPublic()); err != nil {
		return nil, fmt.Errorf("node: peerstore: %w", err)
	}

	limits := limitsFor(cfg)
	rm, err := NewResourceManager(cfg)
	if err != nil {
		return nil, err
	}
	closers = append(closers, rm.Close)
	cm, err := NewConnManager(cfg)
	if err != nil {
		return nil, err
	}
	closers = append(closers, cm.Close)

	bus := eventbus.NewBus()
	sw, err := swarm.NewSwarm(id, ps, bus, swarm.WithResourceManager(rm), swarm.WithDialRanker(tcpFirst),
		swarm.WithDialTimeout(limits.DialTimeout), swarm.WithDialTimeoutLocal(limits.DialTimeout))
	if err != nil {
		return nil, fmt.Errorf("node: swarm: %w", err)
	}
	closers = append(closers, sw.Close)

	muxers := []tptu.StreamMuxer{{ID: yamux.ID, Muxer: muxer}}
	noiseT, err := noise.New(noise.ID, key, muxers)
	if err != nil {
		return nil, fmt.Errorf("node: noise: %w", err)
	}
	tlsT, err := tls.New(tls.ID, key, muxers)
	if err != nil {
		return nil, fmt.Errorf("node: tls: %w", err)
	}
	upgrader, err := tptu.New([]sec.SecureTransport{noiseT, tlsT}, muxers, psk, rm, nil,
		tptu.WithAcceptTimeout(limits.HandshakeTimeout))
	if err != nil {
		return nil, fmt.Errorf("node: upgrader: %w", err)
	}
	// No SO_REUSEPORT: with it a second agent on the same port starts
	// anyway and the kernel splits inbound connections between the two
	// identities (diallers fail with "peer id mismatch"). Without it such a
	// listen fails with "address in use". Reuseport's other use, dialling
	// out from the listen port, serves NAT hole punching, which tribe does
	// not do.
	tcpT, err := tcp.NewTCPTransport(upgrader, rm, nil, tcp.DisableReuseport())
	if err != nil {
		return nil, fmt.Errorf("node: tcp: %w", err)
	}
	if err := sw.AddTransport(tcpT); err != nil {
		return nil, fmt.Errorf("node: tcp: %w", err)
	}

	var quicConns *quicreuse.ConnManager
	if psk == nil { // QUIC cannot carry a pnet key
		if quicConns, err = newQUICConnManager(key, rm); err != nil {
			return nil, err
		}
		closers = append(closers, quicConns.Close)
		quicT, err := quic.NewTransport(key, quicConns, nil, nil, rm)
		if err != nil {
			return nil, fmt.Errorf("node: quic: %w", err)
		}
		if err := sw.AddTransport(quicT); err != nil {
			return nil, fmt.Errorf("node: quic: %w", err)
		}
	}

	h, err := bhost.NewHost(sw, &bhost.HostOpts{
		EventBus:    bus,
		ConnManager: cm,
		EnablePing:  true,
		UserAgent:   "tribe/" + Version,
	})
	if err != nil {
		return nil, fmt.Errorf("node: host: %w", err)
	}
	h.Start()
	return &agentHost{BasicHost: h, quic: quicConns}, nil
}

// NewResourceManager is the resource manager of an agent with
// configuration cfg: the limits of limitsFor (limits.go) and the cap on
// handshakes per address. The simulator builds its hosts with it too.
func NewResourceManager(cfg Config) (network.ResourceManager, error) {
	limits := limitsFor(cfg)
	opts := limits.resourceOptions()
	if cfg.MetricsAddr == "" {
		// The manager's stats are for Prometheus alone, and keeping them
		// costs every stream opened or closed a trace event and label
		// look-ups (6% of an agent's CPU in a fan-out here): without
		// the metrics endpoint nobody reads them.
		opts = append(opts, rcmgr.WithMetricsDisabled())
	}
	base, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(limits.resourceLimits()), opts...)
	if err != nil {
		return nil, fmt.Errorf("node: resource manager: %w", err)
	}
	return newHandshakeGuard(base, limits.HandshakesPerIP), nil
}

// NewConnManager is the connection manager of an agent with
// configuration cfg: it trims to ConnLow when over ConnHigh, sparing
// connections younger than a minute. The simulator builds its hosts with
// it too.
func NewConnManager(cfg Config) (*connmgr.BasicConnMgr, error) {
	cm, err := connmgr.NewConnManager(cfg.ConnLow, cfg.ConnHigh, connmgr.WithGracePeriod(time.Minute))
	if err != nil {
		return nil, fmt.Errorf("node: connection manager: %w", err)
	}
	return cm, nil
}

// agentHost is the basic host plus what its Close does not close.
type agentHost struct {
	*bhost.BasicHost
	quic *quicreuse.ConnManager // nil with a swarm key
}

// Close closes the connections first: the basic host otherwise waits for
// identify exchanges in flight, which on a dead peer's lingering QUIC
// connection only end at identify's timeout.
func (h *agentHost) Close() error {
	errs := []error{h.Network().Close(), h.BasicHost.Close()}
	if h.quic != nil {
		errs = append(errs, h.quic.Close())
	}
	return errors.Join(errs...)
}

// newQUICConnManager makes QUIC's shared UDP sockets, with every inbound
// connection accounted in the resource manager (the QUIC listener expects
// that scope on the connection's context) and the stateless-reset and token
// keys derived from the identity, so they survive restarts.
func newQUICConnManager(key crypto.PrivKey, rm network.ResourceManager) (*quicreuse.ConnManager, error) {
	raw, err := key.Raw()
	if err != nil {
		return nil, fmt.Errorf("node: quic keys: %w", err)
	}
	var resetKey quicgo.StatelessResetKey
	var tokenKey quicgo.TokenGeneratorKey
	if err := deriveKey(raw, "libp2p quic stateless reset key", resetKey[:]); err != nil {
		return nil, err
	}
	if err := deriveKey(raw, "libp2p quic token generator key", tokenKey[:]); err != nil {
		return nil, err
	}
	cm, err := quicreuse.NewConnManager(resetKey, tokenKey,
		quicreuse.ConnContext(func(ctx context.Context, ci *quicgo.ClientInfo) (context.Context, error) {
			addr, err := quicreuse.ToQuicMultiaddr(ci.RemoteAddr, quicgo.Version1)
			if err != nil {
				addr = nil // let the resource manager decide
			}
			scope, err := rm.OpenConnection(network.DirInbound, false, addr)
			if err != nil {
				return ctx, err
			}
			ctx = network.WithConnManagementScope(ctx, scope)
			context.AfterFunc(ctx, scope.Done)
			return ctx, nil
		}),
		quicreuse.VerifySourceAddress(func(addr net.Addr) bool { return rm.VerifySourceAddress(addr) }),
	)
	if err != nil {
		return nil, fmt.Errorf("node: quic: %w", err)
	}
	return cm, nil
}

func deriveKey(secret []byte, info string, out []byte) error {
	k, err := hkdf.Key(sha256.New, secret, nil, info, len(out))
	if err != nil {
		return fmt.Errorf("node: derive %s: %w", info, err)
	}
	copy(out, k)
	return nil
}

// rttInterval is how often yamux measures a connection's round trip
// again after the first measure (at the connection's start). yamux's 30 s
// costs every idle connection a ping each way every 30 s, on top of its
// keepalive (one ping per 30 s that nothing else was heard), and each
// ping wakes both agents: with 100 agents on one host, each holding
// 40–100 connections, 1.9 such pings a second per agent, most of what
// woke an idle agent's connections (uprobes on yamux's Session.Ping).
// The measure only tunes how fast a stream's receive window grows.
const rttInterval = 10 * time.Minute

// muxer is libp2p's yamux (16 MiB stream windows, no stream count limit
// besides the resource manager's), re-measuring round trips every
// rttInterval, and without keepalive pings: yamux sends one on every
// connection that heard nothing for 30 s, and each wakes both agents
// (the sender's timer, the answer, the pong). An idle agent holds 40–100
// connections in a fleet of 100, so those pings were a steady share of
// what woke it, and grow with the connections it holds. What they found
// is found without them: the kernel's TCP keepalive (libp2p sets it,
// every 30 s) tells a peer that vanished without waking the process, and
// a member the failure detector finds dead has its connections closed
// (closeDead). QUIC connections keep QUIC's own keepalive.
var muxer = func() *yamux.Transport {
	c := *(*goyamux.Config)(yamux.DefaultTransport)
	c.MeasureRTTInterval = rttInterval
	c.EnableKeepAlive = false
	return (*yamux.Transport)(&c)
}()
