package node

import (
	"context"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/discovery"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	drouting "github.com/libp2p/go-libp2p/p2p/discovery/routing"
)

// saveInterval is how often changed remembered peers are written out (new
// peers are written at once; this covers address and last-seen updates).
const saveInterval = 30 * time.Second

// emptyTableRecheck is how often discovery looks again while the DHT
// routing table is empty.
const emptyTableRecheck = time.Second

// maxParallelDials bounds the dials one discovery round makes at once.
const maxParallelDials = 8

// mdnsServiceName derives the mDNS service from the cluster, so clusters on
// one LAN do not find each other.
func mdnsServiceName(cluster string) string { return "_tribe-" + cluster + "._udp" }

// rendezvous is the DHT key under which the nodes of a cluster find each other.
func rendezvous(cluster string) string { return "tribe/" + cluster }

type mdnsNotifee struct{ n *Node }

// HandlePeerFound dials a peer mDNS found. mDNS calls it from its own
// goroutine and it must not block, so the dial runs on its own.
func (m mdnsNotifee) HandlePeerFound(ai peer.AddrInfo) {
	n := m.n
	if ai.ID == n.host.ID() || n.host.Network().Connectedness(ai.ID) == network.Connected {
		return
	}
	select {
	case <-n.ctx.Done():
		return
	default:
	}
	n.spawn(func() {
		if err := n.connect(ai); err != nil {
			n.log.Debug("mdns: dial", "peer", ai.ID, "err", err)
			return
		}
		n.log.Info("found peer by mdns", "peer", ai.ID)
	})
}

// discoveryLoop keeps the node at TargetPeers: it redials remembered peers
// and looks the cluster up in the DHT, and keeps the node's own rendezvous
// record fresh. It checks every DiscoveryInterval while short of peers, ten
// times less often otherwise, and every second while it knows no DHT peer.
func (n *Node) discoveryLoop() {
	var disc *drouting.RoutingDiscovery
	tableSize := func() int { return 0 }
	if n.dht != nil {
		disc = drouting.NewRoutingDiscovery(n.dht)
		tableSize = func() int { return n.dht.RoutingTable().Size() }
	}
	ns := rendezvous(n.cfg.Cluster)
	var nextAdvertise time.Time
	for {
		if tableSize() > 0 && !n.now().Before(nextAdvertise) {
			ctx, cancel := context.WithTimeout(n.ctx, time.Minute)
			if _, err := disc.Advertise(ctx, ns); err != nil {
				n.log.Debug("rendezvous: advertise", "err", err)
				nextAdvertise = n.now().Add(n.cfg.DiscoveryInterval)
			} else {
				nextAdvertise = n.now().Add(n.cfg.AdvertiseInterval)
			}
			cancel()
		}
		short := len(n.ConnectedPeers()) < n.cfg.TargetPeers
		if short {
			n.dialAll(n.remembered.due(n.now(), n.isConnected), true)
		}
		if short && tableSize() > 0 {
			n.findPeers(disc, ns)
		}
		wait := n.cfg.DiscoveryInterval
		switch {
		case n.dht != nil && tableSize() == 0:
			// Nothing to ask yet: look again soon, so the first peer
			// (a join, mDNS) leads to the rest without a long wait.
			wait = min(wait, emptyTableRecheck)
		case len(n.ConnectedPeers()) >= n.cfg.TargetPeers:
			wait *= 10
		}
		if !n.sleep(time.Duration(float64(wait) * (0.8 + 0.4*n.float()))) {
			return
		}
	}
}

// findPeers dials cluster peers found under the rendezvous key until the
// node has TargetPeers.
func (n *Node) findPeers(disc *drouting.RoutingDiscovery, ns string) {
	ctx, cancel := context.WithTimeout(n.ctx, time.Minute)
	defer cancel()
	found, err := disc.FindPeers(ctx, ns, discovery.Limit(4*n.cfg.TargetPeers))
	if err != nil {
		n.log.Debug("rendezvous: find peers", "err", err)
		return
	}
	var batch []peer.AddrInfo
	for ai := range found {
		if ai.ID == n.host.ID() || n.isConnected(ai.ID) || len(ai.Addrs) == 0 {
			continue
		}
		batch = append(batch, ai)
	}
	need := n.cfg.TargetPeers - len(n.ConnectedPeers())
	if need <= 0 {
		return
	}
	n.rngMu.Lock()
	n.rng.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
	n.rngMu.Unlock()
	n.dialAll(batch[:min(need, len(batch))], false)
}

// dialAll dials peers, maxParallelDials at a time, and waits for them all.
// For remembered peers a failure pushes their next dial back.
func (n *Node) dialAll(peers []peer.AddrInfo, remembered bool) {
	sem := make(chan struct{}, maxParallelDials)
	var wg sync.WaitGroup
	for _, ai := range peers {
		select {
		case sem <- struct{}{}:
		case <-n.ctx.Done():
			wg.Wait()
			return
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := n.connect(ai)
			if err != nil && remembered {
				n.remembered.failed(ai.ID, n.now(), n.backoff)
			}
		}()
	}
	wg.Wait()
}

func (n *Node) isConnected(p peer.ID) bool {
	return n.host.Network().Connectedness(p) == network.Connected
}

// saveLoop writes remembered-peer updates out now and then.
func (n *Node) saveLoop() {
	for n.sleep(saveInterval) {
		if err := n.remembered.save(); err != nil {
			n.log.Warn("saving remembered peers", "err", err)
		}
	}
}
