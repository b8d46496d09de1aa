// Package node is the tribe agent: the composition root that builds the
// libp2p host, runs discovery (mDNS, --join peers, a private Kademlia DHT
// with rendezvous under the cluster name, remembered peers), wires the
// replicated state (gossip), facts and policies (policy) together, and
// serves the local control API.
//
// Drive it as New (build and validate, no goroutines) then Start (listeners
// and goroutines) then Close; Run does all three around the control API for
// `tribe agent`. The simulator injects a mocknet host through Deps.
//
// What the node wires together, one file each:
//
//	host.go       the libp2p host of a real agent (transports, security, muxer)
//	limits.go     its limits in one table: handshakes, connections, streams
//	handshakes.go the per-address cap on connections still in the handshake
//	hello.go      /tribe/hello/1.0.0: names and clusters of connected peers
//	join.go       --join peers kept connected, with backoff
//	discovery.go  mDNS, DHT rendezvous, and the loop that keeps TargetPeers
//	remembered.go peers seen, kept in <data-dir>/peers.json across restarts
//	swim.go       the failure detector (gossip/swim) over /tribe/swim/1.0.0
//	liveness.go   the alive/suspect/dead/left rule over the detector
//	reap.go       the left and reaping rules (pure)
//	leave.go      farewell on a clean stop, tribe leave, force-leave
//	tribes.go     node records, tribes and manual membership over the state
//	authority.go  the trust model: admission, memberships that count, names
//	policies.go   facts refresh, policies, and this node's policy memberships
//	plugins.go    plugins loaded per tribe, who may call them, tribe call fan-out
//	events.go     the event stream of `tribe watch` (package node/api/events)
//	agent.go      Run: a node plus the control API (node/api)
//	metrics.go    what node/api/metrics reads at scrape time, and /healthz
package node

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/discovery/mdns"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/gossip/authority"
	"github.com/tribeagent/tribe/internal/fsperm"
	"github.com/tribeagent/tribe/keys"
	"github.com/tribeagent/tribe/node/api/events"
	"github.com/tribeagent/tribe/node/api/metrics"
	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/plugins/tasks"
	"github.com/tribeagent/tribe/policy"
)

// Version is the agent's version, set at build time with
// -ldflags "-X github.com/tribeagent/tribe/node.Version=...".
var Version = "0.1.0-dev"

// Deps are the node's collaborators. Every field is optional.
type Deps struct {
	// Host replaces the host New would build from Config (the simulator
	// passes a mocknet host). The node takes ownership and closes it. With a
	// Host, the identity is the host's and ListenAddrs and SwarmKeyFile are
	// ignored.
	Host host.Host
	// Logger receives the node's logs; nil discards them.
	Logger *slog.Logger
	// Rand drives jitter and peer choice; nil seeds one from crypto/rand.
	// The node guards it with its own lock.
	Rand *rand.Rand
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Facts collects the built-in facts; nil means policy.Collect. The
	// simulator gives each node made-up facts.
	Facts func(context.Context) (policy.Facts, error)
	// Plugins are the plugins this node can load; nil means the built-ins
	// (plugins.Builtins) over the config's exec table and file dir.
	Plugins *plugins.Registry
	// Reload reads the configuration again for Node.Reload (tribe reload,
	// SIGHUP); nil means the node cannot reload.
	Reload Reloader
	// LogLevel, if set, is the level Logger logs at: Reload sets it.
	LogLevel *slog.LevelVar
}

// stateTopic is the pubsub topic of a cluster's replicated state.
func stateTopic(cluster string) string { return "tribe/" + cluster + "/state/1" }

// Node is a running tribe agent. Its methods are safe for concurrent use.
type Node struct {
	cfg      Config // as started; see live and running for what reloads change
	log      *slog.Logger
	now      func() time.Time
	host     host.Host
	ownsHost bool // built from Config: Start opens its listeners
	joins    []*join
	psk      pnet.PSK // the swarm key, also for learnPeerID
	lock     *os.File // flock on <data-dir>/lock
	private  bool

	rngMu sync.Mutex
	rng   *rand.Rand
	boot  string // random per start, in our hello

	relinks atomic.Int64 // links started over: the peer restarted, or was missing from the topic (relink)
	// joinRedials is --join connections closed for want of a hello (keepJoined).
	joinRedials atomic.Int64
	relinkMu    sync.Mutex       // guards relinking
	relinking   map[peer.ID]bool // peers whose relink runs -> run it once more (relinkSoon)

	// What tribe reload changes (reload.go): live is read without a lock,
	// inForce (the config in force) and the reload itself under reloadMu.
	live     atomic.Pointer[live]
	reloadMu sync.Mutex
	inForce  Config
	reloader Reloader
	logLevel *slog.LevelVar
	reloads  reloadCounters
	pluginCh chan struct{} // pokes the plugin loop (pokePlugins)
	admitCh  chan struct{} // pokes the auto-admit loop

	peers      *peerBook     // what hello told us about connected peers
	remembered *remembered   // peers.json
	metNew     chan struct{} // a new peer to remember: saveLoop writes it out
	shortSince atomic.Int64  // unix ns since the discovery loop found the node short of peers (0: it is not)

	mdns     mdns.Service
	mdnsGate mdnsGate

	key      crypto.PrivKey
	store    *gossip.Store
	replica  *gossip.Replica
	pubsub   *pubsub.PubSub
	swim     swimState // the failure detector (swim.go)
	badHello atomic.Int64
	// helloing bounds the hellos served at once (hello.go), and
	// helloBusy counts those refused past it.
	helloing  *gossip.Slots
	helloBusy atomic.Int64
	// callConnsClosed counts connections opened for a call and closed
	// after it (useCallConn).
	callConnsClosed atomic.Int64
	connUse         connUse // exchanges under way, by peer (connuse.go)
	// callDialRetries counts calls made again after their dial timed out
	// (plugins.FanOut).
	callDialRetries atomic.Int64
	// callsRelayed counts targets of this node's fan-outs answered
	// through a relay, callsRelayedAgain those a relay did not hand the
	// call to, sent to them directly after (relay.go).
	callsRelayed      atomic.Int64
	callsRelayedAgain atomic.Int64
	relay             *plugins.Relay // passes on and runs orders (plugins.RelayProtocol)
	drops             gossip.Drops   // what pubsub drops under load
	traffic           gossip.Traffic // what pubsub sends and receives

	helloWarn *warnLimit // at most one bad-hello warning per peer a minute
	authWarn  *warnLimit // at most one warning per author a minute (authority.go)

	collectFacts func(context.Context) (policy.Facts, error)
	facts        factsState
	recordMu     sync.Mutex // one writer of the node's record at a time (tribes.go)
	reconcileCh  chan struct{}
	// rewriteOwn asks the next reconcile to write every membership
	// again, equal or not (announceOwn).
	rewriteOwn atomic.Bool

	registry  *plugins.Registry
	sharing   sharing // plugins trusted writers share (sharedplugins.go)
	plugins   pluginSet
	tasks     taskSet
	jobs      jobSet
	calls     *plugins.Server
	caller    *plugins.Caller // makes this node's calls, keeping streams open between them
	records   sync.Map        // state key nodes/<peer> -> *cachedRecord (tribes.go)
	auth      authState
	events    *events.Hub // what `tribe watch` streams (events.go)
	sheds     shedState   // newcomers turned away (shed.go)
	watchLive liveTracker // the liveness transitions watchers have been told (events.go)

	// Leaving (leave.go): leaveMu makes the farewell happen once;
	// leftAt (under recordMu) is when this node left.
	leaveMu   sync.Mutex
	leaving   bool
	leftAt    time.Time
	running   atomic.Bool   // Start finished: Close says farewell
	crashed   atomic.Bool   // Crash: Close says nothing
	leaveReq  chan struct{} // closed by LeaveCluster: Run stops
	leaveOnce sync.Once
	refute    chan struct{} // a force-leave of this node arrived
	recordNow chan struct{} // write the record now (recordLoop)
	// recordLater writes the record once a node that does not count may
	// write it again (putRecord; guarded by recordMu).
	recordLater *time.Timer
	unusable    unusablePolicies // policy entries this node cannot use (policies.go)
	providers   *rendezvousStore // the DHT's provider records (dhtstore.go)

	metrics     *metrics.Metrics       // nil unless Config.MetricsAddr is set
	metricsAddr atomic.Pointer[string] // where Run serves them, once it does

	started   time.Time
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// hostName is the node's name when none is set: the host's name, or
// "tribe" where that is none or one other nodes would refuse (records.go).
func hostName(h string, err error) string {
	if err != nil || h == "" || nameErr(h) != nil {
		return "tribe"
	}
	return h
}

// New validates cfg, takes the data dir (one node per data dir), loads or
// creates the identity, and builds the host. It starts nothing.
func New(cfg Config, deps Deps) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Name == "" {
		cfg.Name = hostName(os.Hostname())
	}
	n := &Node{cfg: cfg, log: deps.Logger, now: deps.Now, rng: deps.Rand, peers: newPeerBook(), relinking: map[peer.ID]bool{},
		collectFacts: deps.Facts, reconcileCh: make(chan struct{}, 1),
		pluginCh: make(chan struct{}, 1), admitCh: make(chan struct{}, 1),
		leaveReq: make(chan struct{}), refute: make(chan struct{}, 1), recordNow: make(chan struct{}, 1), metNew: make(chan struct{}, 1)}
	n.jobs.poke = make(chan struct{}, 1)
	n.jobs.handing = gossip.NewSlots(maxHanding, maxHandingPerPeer)
	n.jobs.listing = gossip.NewSlots(maxListServing, 1)
	n.jobs.outputs = gossip.NewSlots(maxOutputServing, 1)
	n.sharing.serving = gossip.NewSlots(maxFetchServing, 1)
	n.helloing = gossip.NewSlots(helloServing, helloPerPeer)
	n.helloing.Reserved = helloReserved
	n.connUse.peers = map[peer.ID]*connUsers{}
	n.jobs.runner.MaxQueue = cfg.JobQueue
	if n.collectFacts == nil {
		n.collectFacts = policy.Collect
	}
	n.live.Store(liveOf(cfg))
	n.inForce, n.reloader, n.logLevel = cfg, deps.Reload, deps.LogLevel
	n.plugins.loaded = map[string]*loadedPlugin{}
	n.tasks.running, n.tasks.status, n.tasks.dirtied = map[string]*taskRun{}, map[string]tasks.Status{}, make(chan struct{}, 1)
	if n.registry = deps.Plugins; n.registry == nil {
		fileDir := cfg.FileDir
		if fileDir == "" {
			fileDir = filepath.Join(cfg.DataDir, "files")
		}
		n.registry = plugins.Builtins(plugins.Env{ExecTable: func() plugins.ExecConfig { return n.settings().exec }, FileDir: fileDir, FileMaxBytes: cfg.FileMaxBytes, Version: Version,
			Facts: func(context.Context) (map[string]any, error) { return n.facts.get(), nil }})
	}
	if n.log == nil {
		n.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if deps.Plugins == nil {
		n.registerLocalPlugins()
	}
	if n.now == nil {
		n.now = time.Now
	}
	n.helloWarn = newWarnLimit(badHelloWarnEvery, 1024, n.now)
	n.authWarn = newWarnLimit(badHelloWarnEvery, 1024, n.now)
	if n.rng == nil {
		var seed [16]byte
		crand.Read(seed[:])
		n.rng = rand.New(rand.NewPCG(binary.LittleEndian.Uint64(seed[:8]), binary.LittleEndian.Uint64(seed[8:])))
	}
	var boot [8]byte
	crand.Read(boot[:])
	n.boot = hex.EncodeToString(boot[:])
	n.providers = newRendezvousStore(rendezvous(cfg.Cluster), func(p peer.ID) bool { return n.rules().Counts(p) })
	for _, s := range cfg.Join {
		t, _ := parseJoin(s) // Validate has checked it
		n.joins = append(n.joins, newJoin(t))
	}

	if err := prepareDataDir(cfg.DataDir); err != nil {
		return nil, err
	}
	if n.lock, err = lockDataDir(cfg.DataDir); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			n.lock.Close()
		}
	}()

	if deps.Host != nil {
		n.host = deps.Host
		if n.key = n.host.Peerstore().PrivKey(n.host.ID()); n.key == nil {
			return nil, errors.New("node: the given host's peerstore lacks its private key")
		}
	} else {
		key, created, err := keys.LoadOrCreateIdentity(filepath.Join(cfg.DataDir, keys.IdentityFile))
		if err != nil {
			return nil, err
		}
		n.key = key
		if created {
			n.log.Info("created a new identity", "file", filepath.Join(cfg.DataDir, keys.IdentityFile))
		}
		var psk pnet.PSK
		if cfg.SwarmKeyFile != "" {
			if psk, err = keys.LoadSwarmKey(cfg.SwarmKeyFile); err != nil {
				return nil, err
			}
			n.private = true
			n.psk = psk
		}
		if n.host, err = buildHost(cfg, key, psk); err != nil {
			return nil, err
		}
		n.ownsHost = true
	}
	n.log = n.log.With("node", cfg.Name)
	var callOpts []plugins.ServerOption
	if cfg.MetricsAddr != "" {
		n.metrics = metrics.New(metricsSource{n})
		callOpts = append(callOpts, servedOption(n.metrics))
		if n.ownsHost {
			// The resource manager of the host buildHost made keeps its
			// stats (process-wide) when the metrics endpoint is on.
			rcmgr.MustRegisterWith(n.metrics.Registry())
		}
	}
	// Strangers get a handful of call streams (plugins.StrangerCallStreams):
	// they are refused every call anyway.
	callOpts = append(callOpts, plugins.WithCounts(func(p peer.ID) bool { return n.rules().Counts(p) }))
	n.calls = plugins.NewServer(n.host, n, n.log, callOpts...)
	// As many streams kept for the next call as connections kept.
	n.caller = plugins.NewCaller(n.host, cfg.ConnLow)
	n.relay = plugins.NewRelay(plugins.RelayDeps{Host: n.host, Server: n.calls, Key: n.key, Log: n.log,
		Counts: func(p peer.ID) bool { return n.rules().Counts(p) }, Reach: n.learnRecordAddrs, Use: n.useCallConn})
	defer func() {
		if err != nil && n.ownsHost {
			n.host.Close()
		}
	}()

	// The state is loaded before the node talks to anyone.
	if n.store, err = gossip.OpenStore(filepath.Join(cfg.DataDir, gossip.StoreFile), cfg.StateNoSync); err != nil {
		return nil, err
	}
	rcfg := gossip.DefaultReplicaConfig(stateTopic(cfg.Cluster))
	rcfg.SyncInterval = cfg.SyncInterval
	rcfg.Trust = trustOf(cfg)
	// Jobs go to their targets and acks to the job's writer, not to
	// every node: a pulled one is never passed on.
	rcfg.Quiet = func(key string) bool { return strings.HasPrefix(key, jobsPrefix) }
	// Acks go to the writers only (jobacks.go).
	rcfg.Direct = gossip.DirectKey
	// A record must read, with printable text and facts within bounds
	// (records.go).
	rcfg.Value = checkValue
	// An ack is taken only of a job held here, from one of its targets.
	rcfg.Admit = n.admitAck
	// Sync and push slots are kept for the nodes that count, and a node
	// that does not count holds only its record here (read as entries
	// and streams come, after initAuthority below).
	rcfg.Counts = func(id peer.ID) bool { return n.rules().Counts(id) }
	rcfg.Revoked = func(id peer.ID) bool { return n.rules().Status(id) == authority.Revoked }
	n.rngMu.Lock()
	replicaRng := rand.New(rand.NewPCG(n.rng.Uint64(), n.rng.Uint64()))
	n.rngMu.Unlock()
	if n.replica, err = gossip.NewReplica(n.host, n.key, n.store, rcfg, n.log, n.now, replicaRng); err != nil {
		n.store.Close()
		return nil, err
	}
	n.initAuthority()
	n.initJobs()

	var warn error
	n.remembered, warn = loadRemembered(filepath.Join(cfg.DataDir, rememberedFile), cfg.MaxRemembered)
	if warn != nil {
		n.log.Warn("ignoring remembered peers", "err", warn)
	}
	return n, nil
}

// lockDataDir takes an exclusive flock so two agents never share a data dir.
// prepareDataDir makes dir (0700) if it does not exist and refuses one
// that others can write: its state, its plugins and its control socket,
// whoever else could write the dir could replace them.
func prepareDataDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("node: data dir: %w", err)
	}
	if fi, err := os.Stat(dir); err != nil {
		return fmt.Errorf("node: data dir: %w", err)
	} else if why := fsperm.Unsafe(fi); why != "" {
		return fmt.Errorf("node: data dir %s is %s: anyone who can write it could replace the agent's state, plugins and control socket", dir, why)
	}
	return nil
}

func lockDataDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("node: lock data dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("node: data dir %s is in use by another agent", dir)
		}
		return nil, fmt.Errorf("node: lock data dir: %w", err)
	}
	return f, nil
}

// Start opens the listeners and starts discovery. ctx bounds only the
// start-up; the node runs until Close.
func (n *Node) Start(ctx context.Context) error {
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.started = n.now()
	if n.ownsHost {
		if need, have := uint64(limitsFor(n.cfg).FDs()+fdHeadroom), openFileLimit(); have > 0 && have < need {
			n.log.Warn("the open file limit is below what the connection limits may use: raise it (ulimit -n, LimitNOFILE=)",
				"limit", have, "want", need)
		}
	}
	if err := n.startHello(); err != nil {
		return err
	}
	n.startEvents()
	// Pubsub before any connection, in or out: it does not see peers that
	// connected before it existed. So the host listens only once pubsub
	// is there: a peer that redialled a restarting agent at once got in
	// first, and the agent's pubsub never wrote to it.
	var err error
	if n.pubsub, err = pubsub.NewGossipSub(n.ctx, n.host, gossip.PubSubOptions(stateTopic(n.cfg.Cluster), &n.drops, &n.traffic)...); err != nil {
		return fmt.Errorf("node: pubsub: %w", err)
	}
	if err := n.replica.Start(n.pubsub); err != nil {
		return err
	}
	if err := n.startSwim(); err != nil {
		return err
	}
	n.serve()
	if n.ownsHost {
		if err := listen(n.host.Network(), n.cfg.listenAddrs()); err != nil {
			return err
		}
	}
	n.restoreTasks() // before the record is written again
	facts, err := n.gatherFacts(ctx, n.settings())
	if err != nil {
		return fmt.Errorf("node: facts: %w", err)
	}
	if _, err := n.adoptFacts(ctx, facts); err != nil {
		return err
	}
	if err := n.publishSelf(ctx); err != nil {
		return fmt.Errorf("node: write own record: %w", err)
	}
	if n.replica.Trust().Open() {
		n.log.Warn("no trust list: every peer that can connect may write tribe state and call every plugin (set --trusted, and a swarm key)")
	} else if s := n.rules().Status(n.host.ID()); s != authority.Trusted && s != authority.Admitted {
		n.log.Warn("this node is "+string(s)+": its record and memberships count for nothing until a trusted writer admits it (tribe admit)", "id", n.host.ID())
	}
	if n.cfg.MDNS {
		n.mdns = mdns.NewMdnsService(n.host, mdnsServiceName(n.cfg.Cluster), mdnsNotifee{n})
		if err := n.mdns.Start(); err != nil {
			return fmt.Errorf("node: mdns: %w", err)
		}
	}
	for _, j := range n.joins {
		n.spawn(func() { n.keepJoined(j) })
	}
	n.spawn(n.discoveryLoop)
	n.spawn(n.topicLinkLoop)
	n.spawn(n.saveLoop)
	n.watchForced()
	n.spawn(n.recordLoop)
	n.spawn(n.factsLoop)
	n.spawn(n.reconcileLoop)
	n.spawn(n.pluginLoop)
	n.spawn(n.pruneLoop)
	n.spawn(n.taskLoop)
	n.spawn(n.jobLoop)
	if n.cfg.AutoAdmit != "" {
		if !n.replica.Trust().Trusted(n.host.ID()) {
			n.log.Warn("--auto-admit does nothing here while this node is not a trusted writer: only a trusted writer admits nodes")
		}
		n.spawn(n.autoAdmitLoop)
	}
	n.running.Store(true)
	n.log.Info("node started", "id", n.host.ID(), "addrs", n.host.Addrs(), "cluster", n.cfg.Cluster, "mdns", n.cfg.MDNS, "private", n.private)
	return nil
}

// serve registers the protocols peers call this node on (calls, jobs,
// their outputs and lists, shared plugins, task watches) before the host
// listens.
// Each loop registered its own as it started, and a peer that dialled a
// starting node at once (a writer handing it a job as it came back) was
// told the protocol is not supported. A stream that comes before its
// loop runs waits for it, as the loop's state is made in New.
func (n *Node) serve() {
	n.host.SetStreamHandler(JobProtocol, n.serveJob)
	n.host.SetStreamHandler(JobOutputProtocol, n.serveJobOutput)
	n.host.SetStreamHandler(JobListProtocol, n.serveJobList)
	n.host.SetStreamHandler(PluginFetchProtocol, n.serveSharedPlugin)
	n.host.SetStreamHandler(TaskWatchProtocol, n.serveTaskWatch)
	n.calls.Start()
	n.relay.Start()
}

// unserve stops serving what serve registered but calls (closed with
// the call server), as the node stops.
func (n *Node) unserve() {
	for _, p := range []protocol.ID{JobProtocol, JobOutputProtocol, JobListProtocol, PluginFetchProtocol, TaskWatchProtocol} {
		n.host.RemoveStreamHandler(p)
	}
}

// recordInterval is how often the node checks that its record (name,
// addresses) in the replicated state is current.
const recordInterval = time.Minute

// It also refutes a force-leave of this node (leave.go).
func (n *Node) recordLoop() {
	t := time.NewTicker(recordInterval)
	defer t.Stop()
	refute := func() {
		if err := n.refuteForceLeave(n.ctx); err != nil && n.ctx.Err() == nil {
			n.log.Warn("refuting a force-leave", "err", err)
		}
	}
	publish := func() {
		if err := n.publishSelf(n.ctx); err != nil && n.ctx.Err() == nil {
			n.log.Warn("updating own record", "err", err)
		}
	}
	refute()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.refute:
			refute()
		case <-t.C:
			publish()
		case <-n.recordNow:
			publish()
		}
	}
}

// PubSub is the node's gossipsub instance, for components layered on the
// node (and for comparing against plain broadcasts in benchmarks).
func (n *Node) PubSub() *pubsub.PubSub { return n.pubsub }

// Replica is the node's replicated state.
func (n *Node) Replica() *gossip.Replica { return n.replica }

// spawn runs f in a goroutine that Close waits for.
func (n *Node) spawn(f func()) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		f()
	}()
}

// Close says farewell (the node is then `left` to its peers, not dead;
// see leave.go), stops discovery, saves the remembered peers, closes the
// host and releases the data dir. It is safe to call more than once and
// on a node that was never started.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		var errs []error
		if n.running.Load() && !n.crashed.Load() {
			if _, err := n.farewell(context.Background()); err != nil {
				n.log.Warn("leaving", "err", err)
			}
		}
		// The replica leaves its topic while pubsub still runs. A crash
		// does not store what waits to be stored, as a killed process
		// would not.
		if n.replica != nil && n.crashed.Load() {
			errs = append(errs, n.replica.Crash())
		} else if n.replica != nil {
			errs = append(errs, n.replica.Close())
		}
		n.stopWatches()
		n.unserve()
		if n.cancel != nil {
			n.cancel()
		}
		if n.relay != nil {
			errs = append(errs, n.relay.Close())
		}
		if n.calls != nil {
			errs = append(errs, n.calls.Close())
		}
		if n.caller != nil {
			errs = append(errs, n.caller.Close())
		}
		if n.mdns != nil {
			errs = append(errs, n.mdns.Close())
		}
		n.wg.Wait()
		n.plugins.closeAll()
		errs = append(errs, n.remembered.save())
		errs = append(errs, n.host.Close())
		if n.store != nil {
			errs = append(errs, n.store.Close())
		}
		errs = append(errs, n.lock.Close())
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}

// ID is the node's peer ID.
func (n *Node) ID() peer.ID { return n.host.ID() }

// Name is the node's human name.
func (n *Node) Name() string { return n.cfg.Name }

// Dropped counts the message copies pubsub dropped under load, by queue.
func (n *Node) Dropped() map[string]int64 { return n.drops.Counts() }

// Host is the node's libp2p host, for components layered on the node.
func (n *Node) Host() host.Host { return n.host }

// AddrInfo is how other nodes reach this one.
func (n *Node) AddrInfo() peer.AddrInfo {
	return peer.AddrInfo{ID: n.host.ID(), Addrs: n.host.Addrs()}
}

// ConnectedPeers returns the connected peers of the same cluster that have
// answered hello.
func (n *Node) ConnectedPeers() []peer.ID {
	var out []peer.ID
	for _, p := range n.host.Network().Peers() {
		if info, ok := n.peers.get(p); ok && info.Cluster == n.cfg.Cluster {
			out = append(out, p)
		}
	}
	return out
}

// float returns a uniform number in [0, 1) from the node's random source.
func (n *Node) float() float64 {
	n.rngMu.Lock()
	defer n.rngMu.Unlock()
	return n.rng.Float64()
}

// sleep waits for d or until the node closes; it reports whether to go on.
func (n *Node) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-n.ctx.Done():
		return false
	}
}
