package node

import (
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/pnet"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	tls "github.com/libp2p/go-libp2p/p2p/security/tls"
	quic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
)

// Resource manager budget: what libp2p may reserve for connections and
// streams in total. It scales the per-peer and per-protocol limits too.
const (
	rcmgrMemory = 128 << 20
	rcmgrFDs    = 1024
)

// buildHost makes the libp2p host of a real agent: TCP and QUIC only (no
// websocket, webtransport or webrtc, which a fleet agent does not need and
// which cost memory), Noise and TLS security, yamux, a connection manager
// and a resource manager with fixed limits. It does not listen yet: Start
// opens the listeners.
func buildHost(cfg Config, key crypto.PrivKey, psk pnet.PSK) (host.Host, error) {
	cm, err := connmgr.NewConnManager(cfg.ConnLow, cfg.ConnHigh, connmgr.WithGracePeriod(time.Minute))
	if err != nil {
		return nil, fmt.Errorf("node: connection manager: %w", err)
	}
	limits := rcmgr.DefaultLimits
	libp2p.SetDefaultServiceLimits(&limits)
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(limits.Scale(rcmgrMemory, rcmgrFDs)))
	if err != nil {
		return nil, fmt.Errorf("node: resource manager: %w", err)
	}
	opts := []libp2p.Option{
		libp2p.Identity(key),
		libp2p.NoListenAddrs,
		libp2p.Transport(tcp.NewTCPTransport),
		libp2p.Security(noise.ID, noise.New),
		libp2p.Security(tls.ID, tls.New),
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport),
		libp2p.ConnectionManager(cm),
		libp2p.ResourceManager(rm),
		libp2p.DisableRelay(),
		libp2p.DisableMetrics(),
		libp2p.UserAgent("tribe/" + Version),
	}
	if psk != nil {
		opts = append(opts, libp2p.PrivateNetwork(psk))
	} else {
		opts = append(opts, libp2p.Transport(quic.NewTransport))
	}
	h, err := libp2p.New(opts...)
	if err != nil {
		rm.Close()
		return nil, fmt.Errorf("node: libp2p host: %w", err)
	}
	return h, nil
}
