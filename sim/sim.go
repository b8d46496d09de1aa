// Package sim runs many real tribe nodes in one process on libp2p's mock
// network: seeded random topologies, link latency, partitions, crashes and
// restarts with the node's data dir, and waiting for conditions with a
// deadline. Tests, benchmarks and `tribe sim` drive clusters through it.
//
//	s, err := sim.New(sim.Config{Nodes: 100, Seed: 1})
//	defer s.Close()
//	err = s.Start(ctx)
//	err = s.WaitFor(ctx, time.Minute, func() bool { return s.MinPeers() >= 3 })
//
// Each node is a full node.Node (hello, --join peers, Kademlia DHT in server
// mode, rendezvous, remembered peers) with mDNS and the control API off. The
// topology is what the nodes are told to --join: node i joins Config.Joins
// random nodes among 0..i-1, so with one join the seeds form a random tree and
// everything beyond it is found by the nodes' own discovery.
package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/marcopolo/simnet"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/tribeagent/tribe/node"
	"github.com/tribeagent/tribe/policy"
)

// Network is what links the simulated nodes.
type Network int

const (
	// MockNet is libp2p's mock network (p2p/net/mock): no transport and
	// no encryption, links made and cut at will, so partitions, crashes
	// and restarts work. Its streams do not pipeline: a write of 256 bytes
	// or more holds the stream until it has crossed the link, so a burst
	// of k messages to one peer takes about k/2 link latencies.
	MockNet Network = iota
	// SimNet is QUIC over go-libp2p's packet-level network simulator
	// (github.com/marcopolo/simnet, as go-libp2p's x/simlibp2p uses it):
	// per-node up- and downlinks with bandwidth and queues, latency per
	// packet, pipelining like a real path; made to run inside a
	// testing/synctest bubble. Every node can reach every other; Partition,
	// Crash and Restart need MockNet.
	SimNet
)

// Config describes a simulated cluster.
type Config struct {
	// Nodes is the number of nodes (at least 1).
	Nodes int
	// Latency is the one-way delay of every link.
	Latency time.Duration
	// Net is the network between the nodes (default MockNet).
	Net Network
	// Bandwidth is each node's up- and downlink in bits per second on
	// SimNet (default 100 Mbit/s).
	Bandwidth int
	// Seed makes topology, keys' order and each node's randomness repeatable.
	Seed uint64
	// Joins is how many earlier nodes each node is told to --join
	// (default 1).
	Joins int
	// Seeds, if positive, makes every node --join nodes 0..Seeds−1
	// instead of Joins random earlier ones: a fleet that boots against a
	// few seeds, a join storm on them.
	Seeds int
	// Sparse links each node only to the nodes it joins (and they to it)
	// instead of all to all, and turns the nodes' DHT off: the join graph
	// is the cluster. For 1,000-node benchmarks of what spreads over
	// connections (state, calls), where the N² mock links and N DHTs of a
	// full cluster do not fit one process; discovery is not under test.
	Sparse bool
	// Dir holds the nodes' data dirs; empty means a temporary dir that
	// Close removes.
	Dir string
	// Logger receives every node's logs; nil discards them.
	Logger *slog.Logger
	// Trusted are the indices of the nodes every node trusts as writers;
	// empty means every node is trusted (an open trust list).
	Trusted []int
	// Facts, if set, gives node i's built-in facts (each restart calls it
	// again). Nil gives every node just {hostname, sim_index}: collecting
	// the real host's facts hundreds of times would be slow and identical.
	Facts func(i int) policy.Facts
	// Tune, if set, adjusts node i's config before it is built.
	Tune func(i int, cfg *node.Config)
}

// NodeConfig is the node config the simulator starts from: no mDNS, no
// API socket, and discovery timers scaled down to simulation speed.
func NodeConfig() node.Config {
	c := node.DefaultConfig()
	c.MDNS = false
	c.API = false
	c.DiscoveryInterval = time.Second
	c.BackoffMin = 100 * time.Millisecond
	c.BackoffMax = 2 * time.Second
	c.SyncInterval = 5 * time.Second
	c.StateNoSync = true
	return c
}

// Sim is a running simulated cluster. Its methods are safe for concurrent
// use, but Partition, Heal, Crash and Restart should not race each other.
type Sim struct {
	cfg     Config
	mn      mocknet.Mocknet // MockNet
	net     *simnet.Simnet  // SimNet
	netMu   sync.Mutex      // serialises simnet endpoints' creation
	dir     string
	ownsDir bool
	log     *slog.Logger

	mu      sync.Mutex
	members []*member
	group   []int               // partition group of each node; all 0 when healed
	cut     map[[2]peer.ID]bool // pairs Cut apart, both ways
}

type member struct {
	key   crypto.PrivKey
	id    peer.ID
	addr  ma.Multiaddr
	dir   string
	cfg   node.Config
	seed  uint64
	node  *node.Node // nil while crashed
	boots int
}

// New builds the mock network and the nodes, linked all to all. It starts
// nothing.
func New(cfg Config) (*Sim, error) {
	if cfg.Nodes < 1 {
		return nil, fmt.Errorf("sim: need at least 1 node, not %d", cfg.Nodes)
	}
	if cfg.Joins == 0 {
		cfg.Joins = 1
	}
	if cfg.Bandwidth == 0 {
		cfg.Bandwidth = 100_000_000
	}
	s := &Sim{cfg: cfg, mn: mocknet.New(), dir: cfg.Dir, log: cfg.Logger, cut: map[[2]peer.ID]bool{}}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Net == SimNet {
		s.net = &simnet.Simnet{LatencyFunc: simnet.StaticLatency(cfg.Latency), Logger: s.log}
		s.net.Start()
	}
	if s.dir == "" {
		d, err := os.MkdirTemp("", "tribe-sim-")
		if err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
		s.dir, s.ownsDir = d, true
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x7472696265))
	s.mn.SetLinkDefaults(mocknet.LinkOptions{Latency: cfg.Latency})
	s.group = make([]int, cfg.Nodes)
	for i := range cfg.Nodes {
		m, err := s.newMember(i, rng)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.members = append(s.members, m)
	}
	if !cfg.Sparse && cfg.Net == MockNet {
		if err := s.mn.LinkAll(); err != nil {
			s.Close()
			return nil, fmt.Errorf("sim: link: %w", err)
		}
	}
	for i, m := range s.members {
		joins := pickJoins(rng, i, cfg.Joins)
		if cfg.Seeds > 0 {
			joins = seeds(i, cfg.Seeds)
		}
		for _, j := range joins {
			m.cfg.Join = append(m.cfg.Join, s.members[j].p2pAddr())
			if cfg.Sparse && cfg.Net == MockNet {
				if _, err := s.mn.LinkPeers(m.id, s.members[j].id); err != nil {
					s.Close()
					return nil, fmt.Errorf("sim: link: %w", err)
				}
			}
		}
		for _, j := range cfg.Trusted {
			m.cfg.Trusted = append(m.cfg.Trusted, s.members[j].id.String())
		}
	}
	return s, nil
}

// seeds is nodes 0..k−1 but i.
func seeds(i, k int) []int {
	var out []int
	for j := range k {
		if j != i {
			out = append(out, j)
		}
	}
	return out
}

// pickJoins picks up to k distinct nodes among 0..i-1.
func pickJoins(rng *rand.Rand, i, k int) []int {
	if i == 0 {
		return nil
	}
	perm := rng.Perm(i)
	return perm[:min(k, i)]
}

func (s *Sim) newMember(i int, rng *rand.Rand) (*member, error) {
	key, _, err := crypto.GenerateEd25519Key(seededReader{rng})
	if err != nil {
		return nil, fmt.Errorf("sim: key: %w", err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("sim: key: %w", err)
	}
	var addr ma.Multiaddr
	if s.cfg.Net == SimNet {
		addr = ma.StringCast(fmt.Sprintf("/ip4/%s/udp/8000/quic-v1", simnet.IntToPublicIPv4(i)))
	} else {
		addr = ma.StringCast(fmt.Sprintf("/ip6/100::%x:%x/tcp/4001", i>>16, i&0xffff))
		if _, err := s.mn.AddPeer(key, addr); err != nil {
			return nil, fmt.Errorf("sim: add peer: %w", err)
		}
	}
	cfg := NodeConfig()
	// Every node pulls state every SyncInterval: N² work a second, which
	// one process on a laptop cannot do for hundreds of nodes at the
	// agent's rate. Stretch it with N so the whole simulation does about
	// ten a second. Probes cost each node the same at any N, but all N
	// share these cores: about a hundred a second in all.
	cfg.ProbeInterval = max(cfg.ProbeInterval, time.Duration(s.cfg.Nodes)*10*time.Millisecond)
	cfg.SyncInterval = max(cfg.SyncInterval, time.Duration(s.cfg.Nodes)*100*time.Millisecond)
	cfg.Name = fmt.Sprintf("n%d", i)
	cfg.DataDir = filepath.Join(s.dir, cfg.Name)
	cfg.DHT = !s.cfg.Sparse
	if s.cfg.Tune != nil {
		s.cfg.Tune(i, &cfg)
	}
	return &member{key: key, id: id, addr: addr, dir: cfg.DataDir, cfg: cfg, seed: rng.Uint64()}, nil
}

func (m *member) p2pAddr() string { return m.addr.String() + "/p2p/" + m.id.String() }

// seededReader makes key generation repeatable from the sim's seed.
type seededReader struct{ rng *rand.Rand }

func (r seededReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r.rng.Uint32())
	}
	return len(p), nil
}

// Start builds and starts every node, a few at a time.
func (s *Sim) Start(ctx context.Context) error {
	all := make([]int, len(s.members))
	for i := range all {
		all[i] = i
	}
	return s.StartNodes(ctx, all...)
}

// StartNodes builds and starts the nodes given, a few at a time: with
// Start(ctx) replaced by StartNodes(ctx, 0..n-2) and later StartNodes(ctx,
// n-1), a node joins a fleet that is already up. A node that runs is an
// error.
func (s *Sim) StartNodes(ctx context.Context, idx ...int) error {
	sem := make(chan struct{}, 4*runtime.GOMAXPROCS(0))
	errs := make([]error, len(idx))
	var wg sync.WaitGroup
	for k, i := range idx {
		if i < 0 || i >= len(s.members) {
			return fmt.Errorf("sim: no node %d", i)
		}
		if s.Node(i) != nil {
			return fmt.Errorf("sim: node %d is running", i)
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[k] = s.boot(ctx, i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// boot builds and starts node i on its current mocknet host.
func (s *Sim) boot(ctx context.Context, i int) error {
	s.mu.Lock()
	m := s.members[i]
	m.boots++
	seed := m.seed + uint64(m.boots)
	s.mu.Unlock()
	h, err := s.host(m)
	if err != nil {
		return fmt.Errorf("sim: node %d: %w", i, err)
	}
	n, err := node.New(m.cfg, node.Deps{
		Host:   h,
		Logger: s.log.With("sim_node", i),
		Rand:   rand.New(rand.NewPCG(seed, uint64(i))),
		Facts: func(context.Context) (policy.Facts, error) {
			if s.cfg.Facts != nil {
				return s.cfg.Facts(i), nil
			}
			return policy.Facts{"hostname": m.cfg.Name, "sim_index": int64(i)}, nil
		},
	})
	if err != nil {
		h.Close()
		return fmt.Errorf("sim: node %d: %w", i, err)
	}
	if err := n.Start(ctx); err != nil {
		n.Close()
		return fmt.Errorf("sim: node %d: %w", i, err)
	}
	s.mu.Lock()
	m.node = n
	s.mu.Unlock()
	return nil
}

// across reports whether a partition or a Cut separates a and b.
func (s *Sim) across(a, b peer.ID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cut[[2]peer.ID{a, b}] {
		return true
	}
	ga, gb := -1, -1
	for i, m := range s.members {
		switch m.id {
		case a:
			ga = s.group[i]
		case b:
			gb = s.group[i]
		}
	}
	return ga != -1 && gb != -1 && ga != gb
}

// host is m's libp2p host, with a real agent's connection manager: its
// mocknet host, or a new QUIC host on its simnet endpoint that also has an
// agent's resource manager (see simnetHost and mockHost).
func (s *Sim) host(m *member) (host.Host, error) {
	if s.cfg.Net == MockNet {
		h := s.mn.Host(m.id)
		// A dial that found its link just before a partition cut it
		// still completes (mocknet checks links only when a dial
		// starts): close such a connection as it appears, as a firewall
		// would drop its packets.
		h.Network().Notify(&network.NotifyBundle{ConnectedF: func(_ network.Network, c network.Conn) {
			if s.across(m.id, c.RemotePeer()) {
				go c.Close()
			}
		}})
		return newMockHost(h, m.cfg)
	}
	link := simnet.LinkSettings{BitsPerSecond: s.cfg.Bandwidth}
	s.netMu.Lock() // simnet's endpoint list is not safe for concurrent use
	defer s.netMu.Unlock()
	return simnetHost(m.cfg, m.key, m.addr, s.net, simnet.NodeBiDiLinkSettings{Uplink: link, Downlink: link})
}

// Len is the number of nodes, running or crashed.
func (s *Sim) Len() int { return len(s.members) }

// Node returns node i, or nil while it is crashed.
func (s *Sim) Node(i int) *node.Node {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.members[i].node
}

// ID is node i's peer ID, stable across restarts.
func (s *Sim) ID(i int) peer.ID { return s.members[i].id }

// Close stops every node (as a crash would: no farewells) and the mock network, and removes the data dirs if
// the sim made them.
func (s *Sim) Close() error {
	var errs []error
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range s.members {
		if n := s.Node(i); n != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// The whole cluster stops: nobody is left to hear a
				// farewell, and 50 nodes saying it to each other as
				// they close took 18 s.
				err := n.Crash()
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	errs = append(errs, s.mn.Close())
	if s.net != nil {
		s.net.Close()
	}
	if s.ownsDir {
		errs = append(errs, os.RemoveAll(s.dir))
	}
	return errors.Join(errs...)
}
