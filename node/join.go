package node

import (
	"context"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
)

// dialTimeout bounds one connection attempt.
const dialTimeout = 10 * time.Second

// backoff is the wait before retry number failures (1 for the first retry):
// lo doubled per failure, capped at hi, then spread by ±20% with u drawn
// uniformly from [0, 1) so a fleet restarted at once does not dial in step.
func backoff(failures int, lo, hi time.Duration, u float64) time.Duration {
	d := lo
	for i := 1; i < failures && d < hi; i++ {
		d *= 2
	}
	return time.Duration(float64(min(d, hi)) * (0.8 + 0.4*u))
}

func (n *Node) backoff(failures int) time.Duration {
	return backoff(failures, n.cfg.BackoffMin, n.cfg.BackoffMax, n.float())
}

// keepJoined keeps a --join peer connected for the node's whole life: it
// dials it, and dials again with backoff whenever it is not connected.
func (n *Node) keepJoined(ai peer.AddrInfo) {
	n.host.ConnManager().Protect(ai.ID, "tribe-join")
	n.host.Peerstore().AddAddrs(ai.ID, ai.Addrs, peerstore.PermanentAddrTTL)
	// While connected, look again this often; a lost seed is re-dialled
	// within about this time.
	recheck := 10 * n.cfg.BackoffMin
	failures := 0
	for {
		wait := recheck
		if n.host.Network().Connectedness(ai.ID) != network.Connected {
			if err := n.connect(ai); err != nil {
				failures++
				if failures == 1 {
					n.log.Warn("join peer unreachable; retrying with backoff", "peer", ai.ID, "addrs", ai.Addrs, "err", err)
				} else {
					n.log.Debug("join peer still unreachable", "peer", ai.ID, "failures", failures, "err", err)
				}
				wait = n.backoff(failures)
			} else {
				n.log.Info("joined", "peer", ai.ID)
				failures = 0
			}
		}
		if !n.sleep(wait) {
			return
		}
	}
}

// connect dials ai with the node's dial timeout.
func (n *Node) connect(ai peer.AddrInfo) error {
	ctx, cancel := context.WithTimeout(n.ctx, dialTimeout)
	defer cancel()
	return n.host.Connect(ctx, ai)
}
