package sim

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	bhost "github.com/libp2p/go-libp2p/p2p/host/basic"
	"github.com/libp2p/go-libp2p/p2p/host/eventbus"
	"github.com/libp2p/go-libp2p/p2p/host/peerstore/pstoremem"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	libp2pquic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/quicreuse"
	"github.com/marcopolo/simnet"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/quic-go/quic-go"

	"github.com/tribeagent/tribe/node"
)

// simnetHost is a QUIC host on a simnet endpoint at addr, built from its
// parts as an agent's host is (node/host.go), with the agent's resource
// manager and connection manager for cfg (its limits, per-IP ones
// included: every simnet node has its own address), and no address
// discovery (identify's stalls under synctest, as go-libp2p's
// x/simlibp2p says). Not libp2p.New: that constructor links every
// transport libp2p has (WebRTC with the pion stack, WebTransport, relay,
// AutoNAT) into the tribe binary, for the one `tribe sim` uses: 5.8 MB of
// binary, 39 package inits in every CLI command and 3 MB of an idle
// agent's memory.
func simnetHost(cfg node.Config, key crypto.PrivKey, addr ma.Multiaddr, sn *simnet.Simnet, link simnet.NodeBiDiLinkSettings) (_ host.Host, err error) {
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, err
	}
	ps, err := pstoremem.NewPeerstore()
	if err != nil {
		return nil, err
	}
	if err := errors.Join(ps.AddPrivKey(id, key), ps.AddPubKey(id, key.GetPublic())); err != nil {
		return nil, err
	}
	rm, err := node.NewResourceManager(cfg)
	if err != nil {
		return nil, err
	}
	cmgr, err := node.NewConnManager(cfg)
	if err != nil {
		rm.Close()
		return nil, err
	}
	bus := eventbus.NewBus()
	sw, err := swarm.NewSwarm(id, ps, bus, swarm.WithResourceManager(rm))
	if err != nil {
		rm.Close()
		cmgr.Close()
		return nil, fmt.Errorf("sim: swarm: %w", err)
	}
	defer func() {
		if err != nil {
			sw.Close() // and rm with it
			cmgr.Close()
		}
	}()
	var reset quic.StatelessResetKey
	var token quic.TokenGeneratorKey
	rand.Read(reset[:])
	rand.Read(token[:])
	src := &sourceIP{}
	cm, err := quicreuse.NewConnManager(reset, token,
		quicreuse.OverrideSourceIPSelector(func() (quicreuse.SourceIPSelector, error) { return src, nil }),
		quicreuse.OverrideListenUDP(func(_ string, a *net.UDPAddr) (net.PacketConn, error) {
			src.ip.Store(&a.IP)
			return sn.NewEndpoint(a, link), nil
		}))
	if err != nil {
		return nil, fmt.Errorf("sim: quic: %w", err)
	}
	t, err := libp2pquic.NewTransport(key, cm, nil, nil, rm)
	if err == nil {
		err = sw.AddTransport(t)
	}
	if err == nil {
		err = sw.Listen(addr)
	}
	if err != nil {
		cm.Close()
		return nil, fmt.Errorf("sim: quic on simnet: %w", err)
	}
	h, err := bhost.NewHost(sw, &bhost.HostOpts{EventBus: bus, EnablePing: true, ConnManager: cmgr})
	if err != nil {
		cm.Close()
		return nil, fmt.Errorf("sim: host: %w", err)
	}
	h.Start()
	return &simHost{BasicHost: h, quic: cm}, nil
}

// simHost is the basic host plus the QUIC sockets its Close does not close.
type simHost struct {
	*bhost.BasicHost
	quic *quicreuse.ConnManager
}

func (h *simHost) Close() error { return errors.Join(h.BasicHost.Close(), h.quic.Close()) }

// sourceIP is the one address a simnet endpoint dials from.
type sourceIP struct{ ip atomic.Pointer[net.IP] }

func (s *sourceIP) PreferredSourceIPForDestination(*net.UDPAddr) (net.IP, error) {
	return *s.ip.Load(), nil
}

// mockHost is a mocknet host with an agent's connection manager: it
// trims past ConnHigh as an agent's does, and the node's protections and
// tags (join peers, the DHT's, pubsub's) count. Mocknet has no resource
// manager to give it (its networks take none), so only SimNet hosts get
// the agent's stream and connection limits.
type mockHost struct {
	host.Host
	cm connmgr.ConnManager
}

func newMockHost(h host.Host, cfg node.Config) (*mockHost, error) {
	cm, err := node.NewConnManager(cfg)
	if err != nil {
		return nil, err
	}
	h.Network().Notify(cm.Notifee())
	return &mockHost{Host: h, cm: cm}, nil
}

func (h *mockHost) ConnManager() connmgr.ConnManager { return h.cm }

func (h *mockHost) Close() error { return errors.Join(h.Host.Close(), h.cm.Close()) }
