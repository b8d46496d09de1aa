package node

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p-kad-dht/records"
	"github.com/libp2p/go-libp2p/core/discovery"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	drouting "github.com/libp2p/go-libp2p/p2p/discovery/routing"
)

// saveInterval is how often changed remembered peers are written out (new
// peers are written sooner, see saveLoop; this covers address and
// last-seen updates).
const saveInterval = 30 * time.Second

// emptyTableRecheck is how often discovery looks again while the DHT
// routing table is empty.
const emptyTableRecheck = time.Second

// advertiseSpread: the first rendezvous advertisement comes within this
// many discovery intervals of the start (a minute by default), at random.
const advertiseSpread = 6

// advertisers is about how many nodes of a fleet advertise under the
// rendezvous key each AdvertiseInterval: a node that looks the fleet up
// there needs a few of it (the records bring the rest), and every
// advertisement is a walk to the key's nearest nodes, which take one
// record from each: with every node of 5,000 advertising, those 20 would
// serve 8 a second and the fleet would walk the DHT 8 times a second.
// Provider records last 48 hours, so the set of nodes found grows past
// this with the rounds.
const advertisers = 16

// advertiseChance is the chance that a node of a fleet of n nodes
// advertises in a round: every node of a small fleet, about advertisers
// of a large one.
func advertiseChance(n int) float64 {
	if n <= advertisers {
		return 1
	}
	return float64(advertisers) / float64(n)
}

// fleetSize is how many nodes the failure detector knows (this one
// included): nodes that count. Records of others (pending, strangers:
// identities are free to make) must not thin out advertising, or a fleet
// flooded with made-up records stops renewing its DHT rendezvous.
func (n *Node) fleetSize() int {
	if n.swim.d == nil {
		return 1
	}
	return n.swim.d.Stats().Members
}

// maxParallelDials bounds the dials one discovery round makes at once.
const maxParallelDials = 8

// mdnsServiceName derives the mDNS service from the cluster, so clusters on
// one LAN do not find each other.
func mdnsServiceName(cluster string) string { return "_tribe-" + cluster + "._udp" }

// shortARound reports whether the discovery loop found the node short of
// peers at its previous round too (records and remembered peers tried):
// for at least half an interval, since the loop's waits are 0.8 to 1.2
// intervals, so that the second round short, not the third, counts.
func (n *Node) shortARound() bool {
	since := n.shortSince.Load()
	return since != 0 && time.Duration(n.now().UnixNano()-since) >= n.cfg.DiscoveryInterval/2
}

// rendezvous is the DHT key under which the nodes of a cluster find each other.
func rendezvous(cluster string) string { return "tribe/" + cluster }

type mdnsNotifee struct{ n *Node }

// mDNS finds are dialled through a gate: on a LAN of a thousand hosts
// booting at once every host finds every other, and dialling each find at
// once would open a thousand connections per host in the same second,
// which the connection manager then trims. The gate keeps at most
// mdnsDialsInFlight dials going, spreads each over a random wait of up to
// mdnsDialSpread, and skips finds while it is full or while the node has
// ConnHigh peers already; mDNS announces again (every 10 s) and the DHT
// and peer exchange find the rest.
const (
	mdnsDialsInFlight = 8
	mdnsDialSpread    = time.Second
)

// mdnsGate is the gate's state; its counters show in tribe status.
type mdnsGate struct {
	mu       sync.Mutex
	inFlight int
	pending  map[peer.ID]bool // finds being dialled, so a repeat is not dialled twice
	maxSeen  int              // the most dials in flight at once (tests)

	dialled, skipped atomic.Int64
}

// admit reports whether a find of p may be dialled now, and takes a slot.
func (g *mdnsGate) admit(p peer.ID, peers, connHigh int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pending[p] {
		return false // already being dialled: not a skip
	}
	if g.inFlight >= mdnsDialsInFlight || peers >= connHigh {
		g.skipped.Add(1)
		return false
	}
	if g.pending == nil {
		g.pending = map[peer.ID]bool{}
	}
	g.pending[p] = true
	g.inFlight++
	g.maxSeen = max(g.maxSeen, g.inFlight)
	g.dialled.Add(1)
	return true
}

func (g *mdnsGate) done(p peer.ID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.pending, p)
	g.inFlight--
}

// HandlePeerFound dials a peer mDNS found, through the gate. mDNS calls it
// from its own goroutine and it must not block, so the dial runs on its
// own.
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
	if !n.mdnsGate.admit(ai.ID, len(n.host.Network().Peers()), n.cfg.ConnHigh) {
		return
	}
	n.rngMu.Lock()
	wait := time.Duration(n.rng.Int64N(int64(mdnsDialSpread)))
	n.rngMu.Unlock()
	n.spawn(func() {
		defer n.mdnsGate.done(ai.ID)
		if !n.sleep(wait) {
			return
		}
		if n.host.Network().Connectedness(ai.ID) == network.Connected {
			return // it dialled us meanwhile
		}
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
// times less often otherwise, and every second while its DHT runs and
// knows no peer. It starts the DHT (see dhtStartAt) and closes it when it
// returns.
func (n *Node) discoveryLoop() {
	var (
		kad  *dht.IpfsDHT
		disc *drouting.RoutingDiscovery
	)
	defer func() {
		if kad != nil {
			if err := kad.Close(); err != nil {
				n.log.Debug("rendezvous: closing the DHT", "err", err)
			}
		}
	}()
	tableSize := func() int {
		if kad == nil {
			return 0
		}
		return kad.RoutingTable().Size()
	}
	startDHT := n.now().Add(dhtStartAt(n.float(), n.cfg.DiscoveryInterval))
	ns := rendezvous(n.cfg.Cluster)
	var nextAdvertise atomic.Int64 // unix nanoseconds
	var advertising atomic.Bool
	start := func() {
		d, err := n.newDHT()
		if err != nil {
			n.log.Warn("rendezvous: the DHT did not start; trying again next round", "err", err)
			startDHT = n.now().Add(n.cfg.DiscoveryInterval)
			return
		}
		kad, disc = d, drouting.NewRoutingDiscovery(d)
		// The first advertisement comes at a random point of the first
		// advertiseSpread rounds: nodes whose DHTs start together do not
		// all walk to the same key at once. A node that came in through
		// a join, mDNS or a remembered peer is found through its record
		// meanwhile (recordPeers).
		nextAdvertise.Store(n.now().Add(time.Duration(n.float() * float64(advertiseSpread*n.cfg.DiscoveryInterval))).UnixNano())
	}
	for {
		short := len(n.ConnectedPeers()) < n.cfg.TargetPeers
		switch {
		case !short:
			n.shortSince.Store(0)
		case n.shortSince.Load() == 0:
			n.shortSince.Store(n.now().UnixNano())
		}
		if n.cfg.DHT && kad == nil && !n.now().Before(startDHT) {
			start()
		}
		// Advertising is a DHT walk that a loaded node can wait a minute
		// for: it runs beside the loop, one at a time, never in its way.
		// Of a large fleet only about advertisers nodes a round do.
		due := tableSize() > 0 && n.now().UnixNano() >= nextAdvertise.Load()
		if due && n.float() >= advertiseChance(n.fleetSize()) {
			nextAdvertise.Store(n.now().Add(n.cfg.AdvertiseInterval).UnixNano())
			due = false
		}
		if due && advertising.CompareAndSwap(false, true) {
			n.spawn(func() {
				defer advertising.Store(false)
				ctx, cancel := context.WithTimeout(n.ctx, time.Minute)
				defer cancel()
				next := n.cfg.AdvertiseInterval
				if _, err := disc.Advertise(ctx, ns); err != nil {
					n.log.Debug("rendezvous: advertise", "err", err)
					next = n.cfg.DiscoveryInterval
				}
				nextAdvertise.Store(n.now().Add(next).UnixNano())
			})
		}
		if short {
			n.dialAll(n.rememberedDue(), true)
		}
		if need := n.cfg.TargetPeers - len(n.ConnectedPeers()); need > 0 {
			n.dialAll(n.recordPeers(need), false)
		}
		// The DHT only if the records did not do, this round or the one
		// before (a node that just met its first peer has its records a
		// moment later): a lookup dials the peers on its way to the key,
		// and every node of a fleet that starts at once would make one.
		stillShort := short && n.shortARound() && len(n.ConnectedPeers()) < n.cfg.TargetPeers
		if stillShort && n.cfg.DHT && kad == nil {
			start() // its table fills from the node's connections: a lookup next round
		}
		if stillShort && tableSize() > 0 {
			n.findPeers(disc, ns)
		}
		wait := n.cfg.DiscoveryInterval
		switch {
		case kad != nil && tableSize() == 0:
			// Nothing to ask yet: look again soon, so the first peer
			// (a join, mDNS) leads to the rest without a long wait.
			wait = min(wait, emptyTableRecheck)
		case len(n.ConnectedPeers()) >= n.cfg.TargetPeers:
			wait *= 10
		}
		wait = time.Duration(float64(wait) * (0.8 + 0.4*n.float()))
		if n.cfg.DHT && kad == nil {
			wait = min(wait, max(startDHT.Sub(n.now()), 0))
		}
		if !n.sleep(wait) {
			return
		}
	}
}

// dhtStartAt is how long after its start a node starts its DHT, for a
// uniform random r in [0, 1): at a random point from 3 to 9 discovery
// intervals (30 to 90 s by default), or sooner if the loop finds it short
// of peers for a round (it needs a lookup). A DHT that starts with the
// node meets every connection the node makes while a fleet forms: each
// new peer is checked with a DHT query, found peers' addresses are
// dialled, advertisements walk to the rendezvous key, and the SWIM probes
// and gossip that ride the extra connections grew with them. 50 agents
// started at once on 2 cores listed each other alive after 13.1–13.6 s
// with the DHT at start, 3.5–5.1 s with it later or off (by hand, one
// run each; 22–24 s of CPU against 5–7).
func dhtStartAt(r float64, interval time.Duration) time.Duration {
	return time.Duration((3 + 6*r) * float64(interval))
}

// newDHT starts the node's DHT: a private Kademlia DHT in server mode.
func (n *Node) newDHT() (*dht.IpfsDHT, error) {
	return dht.New(n.host,
		dht.Mode(dht.ModeServer),
		dht.ProtocolPrefix("/tribe"),
		dht.BootstrapPeers(n.bootstrapPeers()...),
		// The table fills from the connections the node makes and the
		// lookups it does (advertising, finding peers). The DHT's own
		// refresh walks the key space bucket by bucket as soon as the
		// first peer arrives and again while the table is small: in a
		// fleet that starts at once, every node dialling most others in
		// its first seconds.
		dht.DisableAutoRefresh(),
		// Tribe uses the DHT for rendezvous (providers) and finding
		// peers, never values: with them on, any peer could store
		// records of made-up keys here (public keys, IPNS) for two days,
		// with no bound but its bandwidth.
		dht.DisableValues(),
		dht.ProviderDatastore(n.providers),
		// Each lookup reads the datastore (noProviderCache).
		dht.ProviderManagerOpts(records.Cache(noProviderCache{})),
	)
}

// recordPeers picks up to max peers at random from the node records in the
// replicated state: dialable (see dialable), not connected, with addresses. Peer
// exchange through the state, which a node with one peer already has: it
// finds the rest without waiting on the DHT (whose queries a loaded node
// can wait a minute for) and spreads a join storm's joiners over the
// fleet instead of their one seed.
func (n *Node) recordPeers(max int) []peer.AddrInfo {
	es := n.replica.Prefix(nodesPrefix)
	n.rngMu.Lock()
	n.rng.Shuffle(len(es), func(i, j int) { es[i], es[j] = es[j], es[i] })
	n.rngMu.Unlock()
	rules := n.rules()
	var out []peer.AddrInfo
	for _, e := range es {
		if len(out) >= max {
			break
		}
		// Only nodes that count: a stranger's record could name any
		// address, and every node short of peers would dial it.
		id, err := peer.Decode(strings.TrimPrefix(e.Key, nodesPrefix))
		if err != nil || id == n.host.ID() || n.isConnected(id) || !rules.Counts(id) || !n.dialable(id) {
			continue
		}
		var rec struct {
			Addrs []string `json:"addrs"`
		}
		if json.Unmarshal(e.Value, &rec) != nil {
			continue
		}
		if as := recordAddrs(id, rec.Addrs[:min(len(rec.Addrs), maxRecordAddrs)]); len(as) > 0 {
			out = append(out, peer.AddrInfo{ID: id, Addrs: as})
		}
	}
	return out
}

// maxRecordAddrs bounds the addresses of one record that are dialled.
const maxRecordAddrs = 8

// dialable reports whether a node's record is worth a dial: it has not
// left, and it is not dead, or it wrote its record lately (a node that
// restarted writes one before anyone hears it is back).
func (n *Node) dialable(id peer.ID) bool {
	v := n.view(id)
	switch v.state() {
	case Left:
		return false
	case Dead:
		return v.record != 0 && n.now().Sub(v.record.Wall()) < freshRecord
	}
	return true
}

// freshRecord is how recent a dead node's record must be for a dial.
const freshRecord = time.Minute

// findPeersTimeout bounds one rendezvous lookup: the loop tries again at
// its next round rather than wait on a slow DHT.
const findPeersTimeout = 15 * time.Second

// findPeers dials cluster peers found under the rendezvous key until the
// node has TargetPeers.
func (n *Node) findPeers(disc *drouting.RoutingDiscovery, ns string) {
	ctx, cancel := context.WithTimeout(n.ctx, findPeersTimeout)
	defer cancel()
	found, err := disc.FindPeers(ctx, ns, discovery.Limit(4*n.cfg.TargetPeers))
	if err != nil {
		n.log.Debug("rendezvous: find peers", "err", err)
		return
	}
	var batch []peer.AddrInfo
	for ai := range found {
		batch = append(batch, ai)
	}
	batch = n.rendezvousPeers(batch)
	need := n.cfg.TargetPeers - len(n.ConnectedPeers())
	if need <= 0 {
		return
	}
	n.rngMu.Lock()
	n.rng.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
	n.rngMu.Unlock()
	n.dialAll(batch[:min(need, len(batch))], false)
}

// rendezvousPeers are the peers of a rendezvous lookup worth a dial: only
// nodes that count, as with records and referrals: anyone may advertise
// under the key, with any addresses. A new node that knows no admissions
// yet still finds the trusted writers, whose IDs its config holds, and
// the rest through their records.
func (n *Node) rendezvousPeers(found []peer.AddrInfo) []peer.AddrInfo {
	rules := n.rules()
	var out []peer.AddrInfo
	for _, ai := range found {
		if ai.ID == n.host.ID() || n.isConnected(ai.ID) || len(ai.Addrs) == 0 || !rules.Counts(ai.ID) {
			continue
		}
		out = append(out, ai)
	}
	return out
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

// rememberedDue are the remembered peers to dial this round: those that
// count only (peers.json may be from before the trust list or a
// revocation, and a stranger's addresses are its own to name).
func (n *Node) rememberedDue() []peer.AddrInfo {
	rules := n.rules()
	return n.remembered.due(n.now(), func(p peer.ID) bool { return n.isConnected(p) || !rules.Counts(p) })
}

func (n *Node) isConnected(p peer.ID) bool {
	return n.host.Network().Connectedness(p) == network.Connected
}

// saveBatch is the least time between two writes of the remembered peers
// for new peers: a node that joins a fleet meets dozens in its first
// second, and writing the whole file for each was quadratic.
const saveBatch = time.Second

// saveLoop writes remembered-peer updates out: a new peer at once, or
// with the others met since at most saveBatch after the last write;
// address and last-seen updates every saveInterval.
func (n *Node) saveLoop() {
	t := time.NewTicker(saveInterval)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		case <-n.metNew:
		}
		if err := n.remembered.save(); err != nil {
			n.log.Warn("saving remembered peers", "err", err)
		}
		if !n.sleep(saveBatch) {
			return
		}
	}
}

// rememberSoon has saveLoop write the remembered peers out.
func (n *Node) rememberSoon() {
	select {
	case n.metNew <- struct{}{}:
	default: // a write is due already
	}
}
