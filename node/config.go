package node

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"sync"
	"time"

	ma "github.com/multiformats/go-multiaddr"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/node/api/metrics"
	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/plugins/jobs"
	"github.com/tribeagent/tribe/policy"
)

// Config is the agent's configuration. Build it with DefaultConfig, change
// what you need, and let New validate it.
type Config struct {
	// Name is the node's human name; empty means the host name, looked up
	// by New (never by DefaultConfig).
	Name string
	// DataDir holds the identity key, the remembered peers and the API
	// socket. Created with mode 0700 if missing.
	DataDir string
	// Cluster names the fleet: it derives the mDNS service name and the DHT
	// rendezvous key, and peers of another cluster are not listed as peers.
	Cluster string
	// ListenAddrs are the multiaddrs to listen on. Empty means
	// DefaultListenAddrs (TCP only when a swarm key is set).
	ListenAddrs []string
	// Join are the peers to connect to: a multiaddr with /p2p/<peer-id>, or
	// a TCP address without one, as HOST:PORT or a /ip4, /ip6, /dns, /dns4
	// or /dns6 multiaddr ending in /tcp/PORT, whose peer ID is learnt in
	// the encrypted handshake (see learnPeerID). Each is dialled at start
	// and re-dialled with backoff whenever it is not connected. A dead
	// seed never stops the node.
	Join []string
	// MDNS turns on mDNS discovery on the local network.
	MDNS bool
	// DHT runs the private Kademlia DHT and finds peers by rendezvous
	// through it, from 3 to 9 discovery intervals after the start or
	// once the node is short of peers for a round (see dhtStartAt). Off,
	// a node knows only its --join peers, mDNS finds and remembered peers
	// (the simulator turns it off for its sparse 1,000-node clusters).
	DHT bool
	// SwarmKeyFile, when set, makes the node part of a private network:
	// only nodes with the same key can connect (TCP only; QUIC refuses it).
	SwarmKeyFile string
	// Trusted are the peer IDs of the trusted writers of tribe state
	// (tribes, manual membership, policies, plugins, tasks). Empty means
	// every peer that can connect is trusted; the agent says so.
	Trusted []string
	// AutoAdmit is a CEL expression over a pending node's replicated
	// facts: a trusted writer admits every pending node that matches (and
	// whose name no live node holds). Empty: admission is by hand only.
	// It does nothing on a node that is not a trusted writer.
	AutoAdmit string
	// API serves the control API on <DataDir>/tribe.sock while the node runs
	// under Run. The simulator turns it off.
	API bool

	// TargetPeers is how many tribe peers the node tries to stay connected
	// to through discovery (rendezvous and remembered peers); at most
	// ConnHigh.
	TargetPeers int
	// ConnLow and ConnHigh are the connection manager's water marks.
	ConnLow, ConnHigh int
	// ConnsPerIP caps the connections with one IPv4 address or IPv6 /56,
	// both ways (see limitsFor); 0 means 2 × ConnHigh. Raise it for a site
	// where more agents than that share one public address (a NAT).
	ConnsPerIP int
	// DiscoveryInterval is how often the node looks for more peers while it
	// has fewer than TargetPeers; it checks ten times less often otherwise.
	DiscoveryInterval time.Duration
	// AdvertiseInterval is how often the node renews its rendezvous record.
	AdvertiseInterval time.Duration
	// BackoffMin and BackoffMax bound the wait between dials of a join or
	// remembered peer that does not answer (doubling, with jitter).
	BackoffMin, BackoffMax time.Duration
	// MaxRemembered caps the peers kept in <DataDir>/peers.json.
	MaxRemembered int
	// SyncInterval is how often the node pulls state from a random peer
	// (it also pulls from every peer that connects).
	SyncInterval time.Duration
	// ProbeInterval is how often the failure detector probes one member
	// (see gossip/swim); a probe times out after half of it.
	ProbeInterval time.Duration
	// ReconnectTimeout is how long a dead or left node is kept in this
	// node's views (nodes, members, name resolution) after it was last
	// heard from; then it is reaped: hidden until it is heard from again
	// (Serf's reconnect_timeout). A force-left node is reaped at once.
	ReconnectTimeout time.Duration
	// LeaveTimeout bounds how long a node that leaves (Close, `tribe
	// leave`) waits for a peer to acknowledge its farewell record.
	LeaveTimeout time.Duration
	// StateNoSync skips fsync in the state store. Only for simulations.
	StateNoSync bool
	// Facts are the operator's own facts (--fact), over the facts file's
	// and the built-in ones.
	Facts policy.Facts
	// FactsFile is a YAML or JSON file of user facts, read at start and on
	// every refresh.
	FactsFile string
	// FactsInterval is how often facts are collected again (also on
	// SIGHUP); a change updates the node's record and its policy
	// memberships.
	FactsInterval time.Duration

	// Exec is this host's command table for the exec plugin: callers can
	// run these commands by name and nothing else (unless AllowAny).
	Exec plugins.ExecConfig
	// AcceptPlugins is "trusted" to fetch, install and run the plugins
	// trusted writers share (`tribe plugin add`); empty (the default)
	// runs only what this host installed itself.
	AcceptPlugins string
	// PluginDir holds external plugins: each executable in it whose name
	// is a plugin name is a plugin this host can load. Empty means
	// <DataDir>/plugins.
	PluginDir string
	// FileDir is where the file plugin writes; empty means
	// <DataDir>/files.
	FileDir string
	// FileMaxBytes caps each file the file plugin writes; zero means
	// plugins.DefaultFileMaxBytes. A tribe's max_bytes only lowers it.
	FileMaxBytes int64
	// CallParallel bounds how many calls one `tribe call` has in flight.
	CallParallel int
	// CallRelayFrom: a fan-out with at least this many targets the node
	// holds no connection to hands them to the connected targets to call
	// (relay.go); 0 calls every target directly.
	CallRelayFrom int
	// JobQueue is how many jobs may wait in one tribe's queue on this
	// node; past that the oldest is dropped, and its ack says so.
	JobQueue int
	// JobRetention is how long a finished job, its acks and the outputs
	// kept on its targets stay before they are collected.
	JobRetention time.Duration
	// Procs is how many cores the agent's Go code may use at once (Go's
	// GOMAXPROCS), for the program that runs the node: the node itself
	// does not set it (nodes share a process in tests). 0 means every
	// core.
	Procs int

	// LogLevel ("debug", "info", "warn", "error") and LogFormat ("text",
	// "json") are for the program that builds the agent's logger with
	// NewLogger; the node logs through the logger it is given. Empty means
	// info and text.
	LogLevel, LogFormat string
	// MetricsAddr, when set, is the TCP HOST:PORT where Run serves
	// Prometheus metrics (/metrics) and a health check (/healthz); port 0
	// picks a free port (see Node.MetricsAddr). Empty: off.
	MetricsAddr string
}

// DefaultProcs is the agent's Config.Procs: one core. An agent is a
// helper on a host that runs something else, and its work is many small
// messages (probes, gossip, calls, acks), each a few microseconds of work
// and a thread wake-up or more; with a second core Go's scheduler also
// wakes a second thread to look for work at most of them. Measured on a
// 2-core machine, one core against two, runs alternated (the README's
// "One core"): 50 agents converged about twice as fast on half the CPU,
// idle CPU per agent and a durable job's CPU per target lower, a call's
// latency unchanged. A host that fans out to thousands of hosts (a
// connection handshake each) can give it more.
const DefaultProcs = 1

// DefaultListenAddrs are used when Config.ListenAddrs is empty.
var DefaultListenAddrs = []string{"/ip4/0.0.0.0/tcp/4001", "/ip4/0.0.0.0/udp/4001/quic-v1"}

// DefaultConfig returns the defaults of `tribe agent`. It does no I/O.
func DefaultConfig() Config {
	return Config{
		Cluster:           "tribe",
		MDNS:              true,
		DHT:               true,
		API:               true,
		TargetPeers:       8,
		ConnLow:           64,
		ConnHigh:          128,
		DiscoveryInterval: 10 * time.Second,
		AdvertiseInterval: 10 * time.Minute,
		BackoffMin:        500 * time.Millisecond,
		BackoffMax:        time.Minute,
		MaxRemembered:     256,
		SyncInterval:      30 * time.Second,
		ProbeInterval:     time.Second,
		ReconnectTimeout:  72 * time.Hour,
		LeaveTimeout:      3 * time.Second,
		FactsInterval:     5 * time.Minute,
		CallParallel:      64,
		CallRelayFrom:     16,
		JobQueue:          jobs.DefaultQueue,
		JobRetention:      jobs.DefaultRetention,
		Procs:             DefaultProcs,
	}
}

// clusterRE is compiled when first used, not at every process's start.
var clusterRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`) })

// Validate reports everything wrong with c, joined. It changes nothing.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.DataDir == "" {
		bad("data dir is empty")
	}
	switch {
	case c.AcceptPlugins != "" && c.AcceptPlugins != AcceptTrusted:
		bad("accept plugins %q: %q or nothing", c.AcceptPlugins, AcceptTrusted)
	case c.AcceptPlugins != "" && len(c.Trusted) == 0:
		bad("accept plugins %q needs trusted writers (--trusted): with none, every peer that can connect could send this host code to run", c.AcceptPlugins)
	}
	if !clusterRE().MatchString(c.Cluster) {
		bad("cluster %q: use 1 to 32 lower-case letters, digits and dashes, starting with a letter or digit", c.Cluster)
	}
	if err := nameErr(c.Name); err != nil {
		bad("%v", err) // as other nodes take a record (checkRecord)
	}
	for _, s := range c.ListenAddrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			bad("listen address %q: %v", s, err)
			continue
		}
		if c.SwarmKeyFile != "" && isQUIC(a) {
			bad("listen address %q: QUIC cannot use a swarm key; listen on TCP only", s)
		}
	}
	for _, s := range c.Join {
		if _, err := parseJoin(s); err != nil {
			bad("%v", err)
		}
	}
	for _, s := range c.Trusted {
		if _, err := peer.Decode(s); err != nil {
			bad("trusted writer %q is not a peer ID (see `tribe status` on that host)", s)
		}
	}
	if c.AutoAdmit != "" {
		if len(c.Trusted) == 0 {
			bad("auto-admit needs trusted writers (--trusted): with open trust every node counts")
		}
		if _, err := policy.Compile(c.AutoAdmit); err != nil {
			bad("auto-admit expression: %v", err)
		}
	}
	switch {
	case c.TargetPeers < 1:
		bad("target peers must be at least 1, not %d", c.TargetPeers)
	case c.TargetPeers > c.ConnHigh:
		// A node that seeks more peers than it keeps is short for good:
		// every round it dials every node record it holds, the
		// connection manager trims it back to ConnLow, and busy peers
		// send it on.
		bad("target peers %d is above the connection manager's high water mark (%d)", c.TargetPeers, c.ConnHigh)
	}
	if c.ConnsPerIP < 0 {
		bad("connections per IP must not be negative, not %d", c.ConnsPerIP)
	}
	if c.ConnLow < 1 || c.ConnHigh < c.ConnLow {
		bad("connection water marks must satisfy 1 <= low (%d) <= high (%d)", c.ConnLow, c.ConnHigh)
	}
	for name, d := range map[string]time.Duration{
		"discovery interval": c.DiscoveryInterval,
		"advertise interval": c.AdvertiseInterval,
		"minimum backoff":    c.BackoffMin,
		"sync interval":      c.SyncInterval,
		"probe interval":     c.ProbeInterval,
		"facts interval":     c.FactsInterval,
		"reconnect timeout":  c.ReconnectTimeout,
		"leave timeout":      c.LeaveTimeout,
		"job retention":      c.JobRetention,
	} {
		if d <= 0 {
			bad("%s must be positive, not %v", name, d)
		}
	}
	if c.BackoffMax < c.BackoffMin {
		bad("maximum backoff %v is below the minimum %v", c.BackoffMax, c.BackoffMin)
	}
	if c.MaxRemembered < 0 {
		bad("max remembered peers must not be negative")
	}
	if err := c.Exec.Check(); err != nil {
		bad("%v", err)
	}
	if c.FileMaxBytes < 0 {
		bad("file plugin size cap must not be negative, not %d", c.FileMaxBytes)
	}
	if _, err := NewLogger(io.Discard, c.LogLevel, c.LogFormat); err != nil {
		bad("%v", err)
	}
	if c.JobQueue < 1 {
		bad("job queue must be at least 1, not %d", c.JobQueue)
	}
	if c.Procs < 0 {
		bad("procs %d: a number of cores, or 0 for every core", c.Procs)
	}
	if c.CallRelayFrom < 0 {
		bad("call relaying must start at 0 (off) targets or more, not %d", c.CallRelayFrom)
	}
	if c.CallParallel < 1 {
		bad("call parallelism must be at least 1, not %d", c.CallParallel)
	}
	if c.MetricsAddr != "" {
		if err := metrics.CheckAddr(c.MetricsAddr); err != nil {
			bad("%v", err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("node: invalid config: %w", err)
	}
	return nil
}

// listenAddrs returns the addresses to listen on, defaults applied.
func (c Config) listenAddrs() []ma.Multiaddr {
	src := c.ListenAddrs
	if len(src) == 0 {
		src = DefaultListenAddrs
	}
	var out []ma.Multiaddr
	for _, s := range src {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			continue // Validate has refused it already
		}
		if c.SwarmKeyFile != "" && isQUIC(a) {
			continue // only reachable for the defaults: Validate refuses explicit ones
		}
		out = append(out, a)
	}
	return out
}

func isQUIC(a ma.Multiaddr) bool {
	_, err := a.ValueForProtocol(ma.P_QUIC_V1)
	return err == nil
}
