package gossip

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	pb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
)

// ReplicaConfig configures the I/O shell.
type ReplicaConfig struct {
	// Topic is the pubsub topic of the cluster's state.
	Topic string
	// Trust is the trust list entries are authorised against.
	Trust Trust
	// SyncInterval is how often the replica pulls from a random peer (with
	// ±20% jitter); it also pulls from every peer that connects.
	SyncInterval time.Duration
	// SyncTimeout bounds one pull.
	SyncTimeout time.Duration
	// CollectInterval is how often old tombstones are collected.
	CollectInterval time.Duration
	// Quiet, if set, names the keys whose entries are for a few nodes
	// only (a job for its targets, an ack for the job's writer), which
	// their authors publish themselves if they must: a pulled entry under
	// one is never passed on to the whole topic (see relayFresh).
	Quiet func(key string) bool
	// Direct, if set, names the direct keys (see Scope): anti-entropy
	// compares them only between trusted writers (between every two
	// nodes in a cluster without a trust list). A node gets others'
	// direct entries when they are sent to it, or when it asks
	// (FetchKeys, or SyncScoped in Full).
	Direct func(key string) bool
	// Admit, if set, is the agent's check of what an entry means, which
	// the authorisation table (keys, authors, trust) cannot make: that a
	// job's ack is from one of the job's targets. It is asked of every
	// entry a peer hands or sends this node (a push, an entry handed on
	// another protocol, pubsub, a pull) before it is stored, with held,
	// which finds a live entry in the state or among those that came
	// with it (a job pulled with its acks). A refused entry is not stored
	// and its sender is not penalised: an honest peer may hold what this
	// node refuses (an ack of a job that has not reached it yet, which
	// anti-entropy brings again). Pubsub still passes on what the table
	// allows: the node an entry is for may be reached only through nodes
	// that refuse it. Admit counts what it refuses; it must be safe for
	// concurrent use, must not block, and must not write to the replica.
	Admit func(e *Signed, held func(key string) (*Signed, bool)) error
	// Value, if set, is the agent's check of what an entry's value must
	// hold, whoever holds it and whatever else arrives (a node record
	// must read, with printable text): asked of every entry from a peer
	// with the authorisation table's checks, on every path. An entry it
	// refuses is refused as one the table refuses for a reason an honest
	// peer can have (an agent of an earlier version may hold it):
	// counted value_refused, skipped by a pull (outside its budget of
	// disagreements) and not asked for again for a day (refusedVersions),
	// dropped by pubsub, and not loaded from the store. It must be fast
	// (it runs before pubsub relays an entry), pure, and safe for
	// concurrent use; its errors need not wrap ErrValueRefused.
	Value func(e *Signed) error
	// Counts, if set, reports whether a peer counts: a trusted writer, or
	// a node a trusted writer admitted (authority.Rules.Counts). Sync and
	// push slots are kept for such peers, so that identities anyone can
	// make cannot take them all. With trusted writers set, a node
	// that does not count holds only its record in the state: its other
	// entries are refused (ErrNotAdmitted; not when Counts is nil). nil: the trusted writers of the trust
	// list in force (everyone, with no trust list). It is called as
	// streams open: it must be fast, safe for concurrent use, and must
	// not call the replica.
	Counts func(peer.ID) bool
	// Revoked, if set, reports whether a trusted writer revoked a peer:
	// its record stays held (to say so) but does not count towards
	// MaxPending, so revoking made-up nodes makes room for others. The
	// same rules as for Counts.
	Revoked func(peer.ID) bool
}

// DefaultReplicaConfig returns the agent's defaults for topic.
func DefaultReplicaConfig(topic string) ReplicaConfig {
	return ReplicaConfig{
		Topic:           topic,
		Trust:           NewTrust(),
		SyncInterval:    30 * time.Second,
		SyncTimeout:     time.Minute,
		CollectInterval: time.Hour,
	}
}

// Watcher is called with every change to keys under its prefix, after the
// change is stored and applied. It runs on the goroutine that made the
// change and must not block or call back into the replica's writers.
type Watcher func(Change)

// Replica is the I/O shell around State: it stores, publishes and syncs.
// Its methods are safe for concurrent use.
type Replica struct {
	cfg   ReplicaConfig         // cfg.Trust is the trust list at start; see trust
	trust atomic.Pointer[Trust] // the trust list in force (SetTrust)
	h     host.Host
	key   crypto.PrivKey
	self  peer.ID // key's
	store *Store
	log   *slog.Logger
	now   func() time.Time
	rng   *rand.Rand // guarded by mu

	commits committer // see commit.go

	mu       sync.Mutex
	state    *State
	clock    HLC
	watchers map[int]watch
	nextID   int

	topic *pubsub.Topic
	sub   *pubsub.Subscription
	// unsent holds, by key, this node's own entries written while the
	// topic had no peers (guarded by mu): the first peer to join gets them
	// by pubsub, so they spread beyond it (see onTopicJoin).
	unsent   map[string]*Signed
	counters counters
	pulls    syncTotals   // what SyncWith did, for metrics
	relayed  atomic.Int64 // pulled entries passed on (relayFresh)
	// sharedWaits counts pulls that waited, at their end, for entries
	// other pulls were fetching (awaitShared).
	sharedWaits atomic.Int64
	fetching    fetching        // what pulls are fetching now (guarded by mu)
	refused     refusedVersions // versions pulls refused lately (guarded by mu)
	pending     pendingCount    // records held of nodes that do not count
	// queue holds the peers whose pull waits for a slot, in order, and
	// queued the same as a set (queuePull; guarded by mu).
	queue   []peer.ID
	queued  map[peer.ID]bool
	pullIDs atomic.Uint64
	// meshSince is when the first peer joined the topic (UnixNano; 0
	// before): relayFresh waits for this node's mesh to form.
	meshSince atomic.Int64

	// Guards of the sync protocol (syncguard.go).
	penalties cooldown
	serving   Slots
	pushing   Slots // see push.go
	pulling   Slots // this replica's own pulls (see maxPulling)
	warns     warnLimit
	// firstRequest is firstRequestTimeout, nextRequest
	// nextRequestTimeout; tests shorten or lengthen them.
	firstRequest, nextRequest time.Duration

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type watch struct {
	prefix string
	f      Watcher
}

// NewReplica loads the store into a fresh state, so the node starts from
// what it had before it talks to anyone. key is the node's identity.
func NewReplica(h host.Host, key crypto.PrivKey, store *Store, cfg ReplicaConfig, log *slog.Logger, now func() time.Time, rng *rand.Rand) (*Replica, error) {
	self, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("gossip: identity: %w", err)
	}
	r := &Replica{cfg: cfg, h: h, key: key, self: self, store: store, log: log, now: now, rng: rng,
		state: NewState(cfg.Trust), watchers: map[int]watch{}}
	r.state.SetDirect(cfg.Direct)
	r.serving.Max, r.serving.PerPeer, r.serving.Reserved = maxServing, maxServingPerPeer, servingReserved
	r.pushing.Max, r.pushing.PerPeer, r.pushing.Reserved = maxPushing, maxPushingPerPeer, pushingReserved
	r.pulling.Max, r.pulling.PerPeer, r.pulling.Reserved = maxPulling, maxPullingPerPeer, pullingReserved
	r.firstRequest, r.nextRequest = firstRequestTimeout, nextRequestTimeout
	r.trust.Store(&cfg.Trust)
	loaded, skipped, err := LoadState(store, r.state, cfg.Value)
	if err != nil {
		return nil, err
	}
	if skipped > 0 {
		log.Warn("stored entries the trust list no longer allows were skipped", "skipped", skipped)
	}
	r.clock = r.state.MaxHLC()
	log.Debug("state loaded", "entries", loaded)
	return r, nil
}

// Start joins the state topic on ps, serves the sync protocol and starts
// anti-entropy. ps must have been created before the host connected to
// anyone (pubsub misses peers that connected earlier).
func (r *Replica) Start(ps *pubsub.PubSub) error {
	r.ctx, r.cancel = context.WithCancel(context.Background())
	if err := ps.RegisterTopicValidator(r.cfg.Topic, r.validate); err != nil {
		return fmt.Errorf("gossip: validator: %w", err)
	}
	t, err := ps.Join(r.cfg.Topic)
	if err != nil {
		return fmt.Errorf("gossip: join topic: %w", err)
	}
	r.topic = t
	if r.sub, err = t.Subscribe(pubsub.WithBufferSize(subscriberQueue)); err != nil {
		return fmt.Errorf("gossip: subscribe: %w", err)
	}
	joins, err := t.EventHandler()
	if err != nil {
		return fmt.Errorf("gossip: topic events: %w", err)
	}
	r.h.SetStreamHandler(SyncProtocol, r.serveSync(Full))
	r.h.SetStreamHandler(SyncSharedProtocol, r.serveSync(Shared))
	r.h.SetStreamHandler(PushProtocol, r.servePush)
	r.spawn(r.receive)
	r.spawn(func() { r.onTopicJoin(joins) })
	r.spawn(r.pullPeriodically)
	r.spawn(r.collect)
	return nil
}

func (r *Replica) spawn(f func()) {
	r.wg.Add(1)
	go func() { defer r.wg.Done(); f() }()
}

// Close stops the replica's goroutines, once it has stored the entries
// applied before they were stored (commitBehind). It does not close the
// store.
func (r *Replica) Close() error { return r.close(true) }

// Crash is Close as a killed process goes: the entries applied and not
// stored yet are not stored (their authors, peers or a job's writer hold
// them). For the simulator and tests, so that a crash loses what a real
// one would.
func (r *Replica) Crash() error { return r.close(false) }

func (r *Replica) close(flush bool) error {
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	flushErr := r.endBehind(flush)
	r.h.RemoveStreamHandler(SyncProtocol)
	r.h.RemoveStreamHandler(SyncSharedProtocol)
	r.h.RemoveStreamHandler(PushProtocol)
	if r.sub != nil {
		r.sub.Cancel()
	}
	r.wg.Wait()
	if r.topic != nil {
		return errors.Join(flushErr, r.topic.Close())
	}
	return flushErr
}

// unsentDelay is two of gossipsub's heartbeats (pubsub's
// GossipSubHeartbeatInterval, 1 s): long enough for a new peer's mesh to
// include its other peers.
const unsentDelay = 2 * time.Second

// Depths of pubsub's validation queue and of each peer's outbound queue.
const (
	validateQueue = 256
	outboundQueue = 1024
)

// gossipParams are gossipsub's defaults but for its lazy gossip (IHAVE,
// the IDs of recent messages sent to peers outside the mesh each
// heartbeat). By default a node sends each message's ID to max(6, a
// quarter of its other peers) at each of 3 heartbeats: 15–30 peers at the
// 60–128 connections an agent holds in a large fleet, each RPC waking
// both ends. With 60 agents on loopback, a node joining cost every other
// agent ~53 pubsub RPCs, three quarters of them IHAVEs; this halves them
// (the CPU a join costs the others, 11–16 ms each, moved within this
// machine's noise: pubsub is not most of it). Here a node gossips to 3
// peers at the 2 heartbeats after a message, whatever its connection
// count: per node and message the cost does not grow with the fleet.
// Gossip only repairs what the mesh missed; the publisher's flood to all
// its peers, the mesh's eager push (D = 6) and anti-entropy (sync.go)
// deliver the rest.
//
// IDONTWANT (a node tells its mesh peers, on a message's first copy, not
// to send it one) is for large messages only: past idontwantFrom. For an
// entry of a few kilobytes it saved nothing here: on the same 60 agents a
// node sent one to each mesh peer for every entry (8–9 RPCs) and still
// received 7 copies of 8, its peers having forwarded before it arrived.
func gossipParams() pubsub.GossipSubParams {
	p := pubsub.DefaultGossipSubParams()
	p.Dlazy, p.GossipFactor, p.HistoryGossip = gossipPeers, 0, gossipHeartbeats
	p.IDontWantMessageThreshold = idontwantFrom
	return p
}

// gossipPeers, gossipHeartbeats and idontwantFrom: see gossipParams.
const (
	gossipPeers      = 3
	gossipHeartbeats = 2
	idontwantFrom    = 16 << 10
)

// PubSubOptions are the pubsub settings the state topic needs: entries are
// signed envelopes, so pubsub's own signature is redundant (StrictNoSign)
// and message IDs are content hashes, so a re-published entry is a
// duplicate. A node floods its own entries to every peer in the topic:
// without it (go-libp2p-pubsub's default is off) an entry published while
// the mesh is still empty, just after start, went nowhere — the next
// heartbeat grafts those very peers into the mesh and gossip skips mesh
// peers — and waited for the periodic anti-entropy (seen: 30 s). Tracers
// count what pubsub does (Drops, Traffic). Gossip is gossipParams'.
func PubSubOptions(topic string, tracers ...pubsub.RawTracer) []pubsub.Option {
	params, thresholds := scoreParams(topic)
	opts := []pubsub.Option{
		pubsub.WithGossipSubParams(gossipParams()),
		pubsub.WithPeerScore(params, thresholds),
		pubsub.WithFloodPublish(true),
		pubsub.WithMessageSignaturePolicy(pubsub.StrictNoSign),
		pubsub.WithMessageIdFn(func(m *pb.Message) string {
			h := sha256.Sum256(m.Data)
			return string(h[:20])
		}),
		pubsub.WithMaxMessageSize(MaxEntrySize + 1024),
		// Every copy of a message waits in the validation queue until
		// its duplicates are dropped; pubsub's 32 overflow (and drop
		// copies, leaving some nodes to wait for the next gossip round)
		// when many nodes publish at once, as when a policy is created.
		pubsub.WithValidateQueueSize(validateQueue),
		// Each peer's outbound queue must hold such a burst too: a node
		// forwards every membership of the wave to each mesh peer at
		// once, and pubsub's 32 dropped copies by the hundred thousand
		// in a 300-node simulation. The queue grows only when used.
		pubsub.WithPeerOutboundQueueSize(outboundQueue),
	}
	for _, t := range tracers {
		opts = append(opts, pubsub.WithRawTracer(t))
	}
	return opts
}

// Put writes key = value as this node, and returns once it is stored and
// applied; then it is published.
func (r *Replica) Put(ctx context.Context, key string, value []byte) (*Signed, error) {
	return r.write(ctx, Entry{Key: key, Value: value}, true, nil)
}

// PutQuiet writes key = value as this node like Put, durably, but does not
// publish it: peers get it when they pull (anti-entropy) or when Announce
// publishes it. For a state most peers need not hear of at once, as a
// job's running ack that its done ack replaces a moment later.
func (r *Replica) PutQuiet(ctx context.Context, key string, value []byte) (*Signed, error) {
	return r.write(ctx, Entry{Key: key, Value: value}, false, nil)
}

// PutQuietWith is PutQuiet that stores with the new entry others'
// entries that Check took, in one store transaction: one disk sync for
// all, as a job's target stores the job it was handed with its running
// ack.
func (r *Replica) PutQuietWith(ctx context.Context, key string, value []byte, with ...*Signed) (*Signed, error) {
	return r.write(ctx, Entry{Key: key, Value: value}, false, nil, with...)
}

// PutBehind writes key = value as this node like PutQuiet, but first
// hands the signed entry to sent, which may send it on and reports
// whether another node will keep it durably (as a job's writer stores
// the final ack a target answers with). If so, the entry is applied at
// once and stored with the next commit, at most a second later, rather
// than with a disk sync of its own: a process that dies meanwhile loses
// it here, and gets it back from that node (a job's target asks its
// writer for its acks when it starts again). sent must not block.
func (r *Replica) PutBehind(ctx context.Context, key string, value []byte, sent func(*Signed) bool) (*Signed, error) {
	return r.write(ctx, Entry{Key: key, Value: value}, false, sent)
}

// TopicPeers are the peers pubsub lists in the state topic: those this
// node exchanges published entries with.
func (r *Replica) TopicPeers() []peer.ID {
	if r.topic == nil {
		return nil
	}
	return r.topic.ListPeers()
}

// Announce publishes s, an entry this node wrote with PutQuiet, if it is
// still the entry for its key.
func (r *Replica) Announce(ctx context.Context, s *Signed) {
	if cur, ok := r.Get(s.Key); !ok || cur.Hash != s.Hash || r.topic == nil {
		return
	}
	if !r.holdUnsent(s) {
		r.publish(ctx, s)
	}
}

// Delete writes a tombstone for key.
func (r *Replica) Delete(ctx context.Context, key string) (*Signed, error) {
	return r.write(ctx, Entry{Key: key, Deleted: true}, true, nil)
}

func (r *Replica) write(ctx context.Context, e Entry, publish bool, sent func(*Signed) bool, with ...*Signed) (*Signed, error) {
	author, err := peer.IDFromPrivateKey(r.key)
	if err != nil {
		return nil, err
	}
	if err := r.Trust().Authorize(e.Key, author); err != nil {
		return nil, err
	}
	if err := r.checkPerAuthor(&Signed{Entry: Entry{Key: e.Key, Author: author}}); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.clock = Next(r.clock, r.now())
	e.HLC = r.clock
	r.mu.Unlock()
	s, err := Sign(e, r.key)
	if err != nil {
		return nil, err
	}
	var changes []*Change
	if sent != nil && sent(s) {
		changes, err = r.commitBehind([]*Signed{s})
	} else {
		changes, err = r.commit(append(slices.Clip(with), s))
	}
	r.notify(changes)
	if err != nil {
		if !slices.ContainsFunc(changes, func(c *Change) bool { return c.New == s }) {
			return nil, err
		}
		// Stored: what failed was another's entry written with it.
		r.log.Warn("storing entries written with this node's", "key", s.Key, "err", err)
	}
	if publish && r.topic != nil && !r.holdUnsent(s) {
		r.publish(ctx, s)
	}
	return s, nil
}

// holdUnsent keeps s for later if no peer is in the topic yet: published
// now it would reach nobody, and a peer that pulls it on joining does not
// pass on what it pulled, so beyond that peer it would wait for periodic
// anti-entropy, hop by hop. A node writes its own record at start, before
// it has any connection.
func (r *Replica) holdUnsent(s *Signed) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.topic.ListPeers()) > 0 {
		return false
	}
	if r.unsent == nil {
		r.unsent = map[string]*Signed{}
	}
	r.unsent[s.Key] = s
	return true
}

// publishUnsent publishes what holdUnsent kept, now that a peer has
// joined, once the meshes have had unsentDelay to form: a peer forwards a
// message only to its mesh, and gossip (IHAVE) goes only to peers outside
// it, so a message that arrives before the mesh forms is forwarded to
// nobody.
func (r *Replica) publishUnsent() {
	r.mu.Lock()
	pending := len(r.unsent) > 0
	r.mu.Unlock()
	if !pending {
		return
	}
	select {
	case <-time.After(unsentDelay):
	case <-r.ctx.Done():
		return
	}
	r.mu.Lock()
	held := r.unsent
	r.unsent = nil
	r.mu.Unlock()
	for _, s := range held {
		r.publish(r.ctx, s)
	}
}

func (r *Replica) publish(ctx context.Context, s *Signed) {
	if err := r.topic.Publish(ctx, s.Raw); err != nil && r.ctx.Err() == nil {
		// Stored and applied: anti-entropy still spreads it.
		r.log.Warn("publish failed; anti-entropy will spread the entry", "key", s.Key, "err", err)
	}
}

// notify calls the watchers in the order they were registered: a watcher
// may rely on one registered before it having seen the same change.
func (r *Replica) notify(changes []*Change) {
	r.mu.Lock()
	ids := slices.Sorted(maps.Keys(r.watchers))
	ws := make([]watch, 0, len(ids))
	for _, id := range ids {
		ws = append(ws, r.watchers[id])
	}
	r.mu.Unlock()
	for _, c := range changes {
		for _, w := range ws {
			if strings.HasPrefix(c.Key, w.prefix) {
				w.f(*c)
			}
		}
	}
}

// Forget drops keys from this replica, stored and held, without a
// tombstone: for others' direct entries (see Scope) this node no longer
// needs, as every node drops the acks of a job that is gone. Watchers see
// each key dropped (New nil).
func (r *Replica) Forget(keys ...string) error {
	r.commits.mu.Lock() // no commit between the state's change and the store's
	defer r.commits.mu.Unlock()
	var changes []*Change
	var gone []string
	r.mu.Lock()
	for _, k := range keys {
		delete(r.commits.behind, k)
		if old := r.state.forget(k); old != nil {
			gone = append(gone, k)
			changes = append(changes, &Change{Key: k, Old: old})
		}
	}
	r.mu.Unlock()
	if len(gone) == 0 {
		return nil
	}
	err := r.store.Delete(gone...)
	r.notify(changes)
	return err
}

// Watch calls f for every change under prefix until the returned cancel
// is called.
func (r *Replica) Watch(prefix string, f Watcher) (cancel func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := r.nextID
	r.nextID++
	r.watchers[id] = watch{prefix, f}
	return func() {
		r.mu.Lock()
		delete(r.watchers, id)
		r.mu.Unlock()
	}
}

// Get returns the live entry under key.
func (r *Replica) Get(key string) (*Signed, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state.Get(key)
}

// Version returns whatever version is held for key, tombstones included.
func (r *Replica) Version(key string) (*Signed, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state.Version(key)
}

// Prefix returns the live entries under prefix, by key.
func (r *Replica) Prefix(prefix string) []*Signed {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state.Prefix(prefix)
}

// Children returns the live entries one segment below prefix, by key
// (see State.Children).
func (r *Replica) Children(prefix string) []*Signed {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state.Children(prefix)
}

// Segments returns the distinct segments below prefix in the keys held
// (see State.Segments).
func (r *Replica) Segments(prefix string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state.Segments(prefix)
}

// Hash is the strong hash of the whole state (see State.Hash).
func (r *Replica) Hash() [32]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state.Hash()
}

// Len is the number of keys held, tombstones included.
func (r *Replica) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state.Len()
}

// StoreCommits is how many write transactions (disk syncs) the store made.
func (r *Replica) StoreCommits() int64 { return r.store.Commits() }

// Trust is the replica's trust list.
func (r *Replica) Trust() Trust { return *r.trust.Load() }

// counts reports whether p counts (ReplicaConfig.Counts).
func (r *Replica) counts(p peer.ID) bool {
	if r.cfg.Counts != nil {
		return r.cfg.Counts(p)
	}
	return r.Trust().Trusted(p)
}

// check validates an opened entry against the trust list in force, that
// its author may hold entries beyond its record (checkCounts), and that
// a new key does not pass its author's bound (checkPerAuthor). The
// pubsub validator, pushes and pulls check before they apply, without
// the replica's lock: checkPerAuthor takes it for a moment, so callers
// must not hold it.
//
// The value is checked before the counts, as it was before validate
// split them: a pull skips a refused value outside its budget of
// disagreements and remembers it for a day (valueRefusedFor), and a bad
// record of a stranger's that older peers hold must stay so refused,
// however large.
func (r *Replica) check(e *Signed, now time.Time) error {
	t := r.Trust()
	if err := t.Check(e, now); err != nil {
		return err
	}
	if err := r.checkValue(e); err != nil {
		return err
	}
	if err := r.checkCounts(t, e, true); err != nil {
		return err
	}
	return r.checkPerAuthor(e)
}

// checkSaid is the part of check that looks only at what e says of its
// key, author and clock, cheaply (no value is decoded), and changes
// nothing: the trust list's rules, an author that does not count (a
// pending record's bounds, without taking its slot), a kind bounded per
// author. What it refuses is refused whatever e's signature, so it may
// run before the signature is checked (see validate).
func (r *Replica) checkSaid(e *Signed, now time.Time) error {
	t := r.Trust()
	if err := t.Check(e, now); err != nil {
		return err
	}
	if err := r.checkCounts(t, e, false); err != nil {
		return err
	}
	return r.checkPerAuthor(e)
}

// checkSigned is the rest of check, for an entry whose signature was
// checked: its value (ReplicaConfig.Value), and a pending record's slot
// (checkPending).
func (r *Replica) checkSigned(e *Signed) error {
	if err := r.checkValue(e); err != nil {
		return err
	}
	return r.checkCounts(r.Trust(), e, true)
}

// checkValue asks ReplicaConfig.Value of e.
func (r *Replica) checkValue(e *Signed) error {
	if r.cfg.Value != nil {
		if err := r.cfg.Value(e); err != nil {
			return fmt.Errorf("%w: %s by %s: %w", ErrValueRefused, e.Key, e.Author, err)
		}
	}
	return nil
}

// ErrAuthorFull refuses a new key of a kind bounded per author
// (Kind.MaxPerAuthor) from an author who holds as many here already.
var ErrAuthorFull = errors.New("gossip: author holds as many keys of this kind as one may")

// checkPerAuthor refuses a new key of a kind bounded per author
// (Kind.MaxPerAuthor) whose author holds as many here, tombstones
// included: a node that counts could otherwise have every node hold a
// membership of its own in as many made-up tribes as it liked (it may
// name any tribe), each up to MaxValueLen. A new version of a key held is
// always taken. Checks made at once may each find the last slot free, so
// the bound may be passed by as many as are checked together (pubsub
// validates in parallel). Nodes may hold different keys of such an author
// and so refuse different ones: it is refused as a disagreement is
// (counted author_full, not scored).
func (r *Replica) checkPerAuthor(e *Signed) error {
	k, ok := bounded(e.Key)
	if !ok {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, held := r.state.Version(e.Key); held {
		return nil
	}
	if n := r.state.AuthorHolds(k.Name, e.Author); n >= k.MaxPerAuthor {
		return fmt.Errorf("%w: %s by %s, who has %d %s keys held here", ErrAuthorFull, e.Key, e.Author, n, k.Name)
	}
	return nil
}

// ErrValueRefused refuses an entry whose value ReplicaConfig.Value
// refuses.
var ErrValueRefused = errors.New("gossip: value refused")

// ErrNotAdmitted refuses an entry that a node whose entries do not count
// yet wrote under its own name, other than its record.
var ErrNotAdmitted = errors.New("gossip: author not admitted")

// checkCounts refuses, in a cluster with trusted writers, the entries of a
// node that does not count (pending, revoked, or a stranger) other than
// its record: its policy memberships and job acks would count for nothing
// until a trusted writer admitted it, but every node stored them, and
// identities are free to make, so one peer could fill every node's disk.
// Its record is taken (trusted writers admit nodes by what it says). Once
// admitted, a node publishes its entries again (the node does, on its
// admission), and anti-entropy brings them too.
func (r *Replica) checkCounts(t Trust, e *Signed, signed bool) error {
	// This node's own entries are always taken: a node whose state was
	// lost asks for them back (its acks, before it decides whether it
	// ran a job) before it has its own admission again.
	if r.cfg.Counts == nil || e.Author == r.self || t.Trusted(e.Author) {
		return nil
	}
	k, _, err := classify(e.Key)
	switch {
	case err != nil || k.Writer != Self || r.cfg.Counts(e.Author):
		return nil
	case k.Name == "node":
		return r.checkPending(e, signed)
	}
	return fmt.Errorf("%w: %s by %s", ErrNotAdmitted, e.Key, e.Author)
}

// ForgetRefusals forgets the versions pulls refused lately (see
// refusedVersions), so the next pulls ask for them again: the node calls
// it when who counts changes (an admission), as an entry refused before
// may be taken now.
func (r *Replica) ForgetRefusals() {
	r.mu.Lock()
	r.refused = refusedVersions{}
	r.mu.Unlock()
}

// SetTrust replaces the trust list while the replica runs (tribe reload):
// the state is loaded again from the store under the new list, as at
// start, so entries of writers no longer trusted stop counting and stored
// entries the old list skipped count again; watchers see each key whose
// entry changed (New nil for a key that is gone). Entries the old list
// refused on arrival were never stored: anti-entropy brings them back, and
// peers cooling down for sending them are forgiven. It costs a signature
// check per stored entry, under the replica's lock.
func (r *Replica) SetTrust(t Trust) (changed int, err error) {
	r.commits.mu.Lock() // no commit between the store's load and the swap
	defer r.commits.mu.Unlock()
	// Entries applied but not stored yet (commitBehind: peers' broadcast
	// entries, this node's PutBehind writes) are not in the store the
	// state is loaded from: stored first, or the reload would drop them.
	if len(r.commits.behind) > 0 {
		if _, err := r.commitLocked(nil); err != nil {
			return 0, fmt.Errorf("gossip: storing the entries applied before the trust list changed: %w", err)
		}
	}
	r.mu.Lock()
	st := NewState(t)
	st.SetDirect(r.cfg.Direct)
	loaded, skipped, err := LoadState(r.store, st, r.cfg.Value)
	if err != nil {
		r.mu.Unlock()
		return 0, err
	}
	old := r.state
	var changes []*Change
	for k, oe := range old.entries {
		if ne := st.entries[k]; ne == nil || !sameVersion(oe, ne) {
			changes = append(changes, &Change{Key: k, Old: oe, New: ne})
		}
	}
	for k, ne := range st.entries {
		if old.entries[k] == nil {
			changes = append(changes, &Change{Key: k, New: ne})
		}
	}
	slices.SortFunc(changes, func(a, b *Change) int { return strings.Compare(a.Key, b.Key) })
	r.state = st
	r.refused = refusedVersions{}
	r.trust.Store(&t)
	r.mu.Unlock()
	r.penalties.forgive()
	r.log.Info("trust list replaced; state loaded again", "entries", loaded, "skipped", skipped, "changed", len(changes))
	r.notify(changes)
	if p, ok := r.randomPeer(); ok && r.ctx != nil {
		r.spawnPull(p)
	}
	return len(changes), nil
}

func sameVersion(a, b *Signed) bool {
	return a.Hash == b.Hash
}

// validate is the topic validator: it rejects (not ignores) anything that
// does not open, is not authorised or is from the future, and counts why.
//
// What the entry says is checked before its signature (peek, checkSaid):
// a pubsub message costs any peer that can connect nothing to
// send, and entries of made-up identities (a membership or an ack of a
// node that does not count, a record past MaxPending) were refused only
// after a signature check each, 70 µs, ignored and never scored, so one
// peer could keep a core busy with them. They now cost a decode. An entry
// so refused is refused whatever its signature: a forged one is ignored,
// not rejected, when an honest peer could have sent what it says it is.
func (r *Replica) validate(_ context.Context, from peer.ID, m *pubsub.Message) pubsub.ValidationResult {
	e, err := peek(m.Data)
	if err == nil {
		err = r.checkSaid(e, r.now())
	}
	if err == nil {
		if e, err = Open(m.Data); err == nil {
			err = r.checkSigned(e)
		}
	}
	if err != nil {
		r.counters.reject(err)
		r.log.Debug("rejected entry from pubsub", "from", from, "err", err)
		if honestMayRelay(err, e, from) {
			return pubsub.ValidationIgnore // dropped, not scored
		}
		return pubsub.ValidationReject // dropped, and from's score falls
	}
	m.ValidatorData = e
	return pubsub.ValidationAccept
}

// honestMayRelay reports whether an honest peer could have sent an entry
// refused with err: one signed and well formed that its own rules allow
// and ours do not (another version's key kinds or values, a trust list
// being rolled out, a clock ahead), written by someone else. Bytes that
// do not open or verify, oversized ones, and the sender's own entries
// that break the rules are its doing: pubsub rejects them and lowers its
// score. A value refused here is only ignored, even from its author:
// pubsub marks a rejected message invalid whoever delivers it (the
// message ID is its content's hash), so an author that sent its bad
// record here and to a peer of an earlier version, which takes it and
// passes it on, would lower that honest peer's score too.
func honestMayRelay(err error, e *Signed, from peer.ID) bool {
	if !disagreement(err) {
		return false
	}
	return errors.Is(err, ErrValueRefused) || !errors.Is(err, ErrUnauthorized) || e.Author != from
}

// receive applies validated entries from the topic. Entries that queued
// up while the previous batch was being stored go into one store
// transaction (one fsync) and one pass of the watchers: stored one by one,
// a node takes a disk sync per entry, about 1.7 ms on an SSD, and falls
// behind (and pubsub then drops entries for it) when a policy makes many
// nodes write their memberships at once.
func (r *Replica) receive() {
	in := make(chan *Signed, receiveQueue)
	r.spawn(func() {
		defer close(in)
		for {
			m, err := r.sub.Next(r.ctx)
			if err != nil {
				return
			}
			if e, ok := m.ValidatorData.(*Signed); ok {
				select {
				case in <- e:
				case <-r.ctx.Done():
					return
				}
			}
		}
	})
	for e := range in {
		r.applyGossiped(drain(in, []*Signed{e}, maxReceiveBatch))
	}
}

// Bounds of the receive path: the subscription's buffer (pubsub's 32
// overflowed when the goroutine reading it was not scheduled in time),
// entries waiting to be stored, and entries stored in one transaction.
const (
	subscriberQueue = 256
	receiveQueue    = 1024
	maxReceiveBatch = 128
)

// drain appends to batch whatever ch holds right now, up to max entries.
func drain[T any](ch <-chan T, batch []T, max int) []T {
	for len(batch) < max {
		select {
		case v, ok := <-ch:
			if !ok {
				return batch
			}
			batch = append(batch, v)
		default:
			return batch
		}
	}
	return batch
}

// applyRemote stores and applies entries from peers and tells watchers;
// it returns how many changed the state.
func (r *Replica) applyRemote(entries []*Signed) int {
	return len(r.applyRemoteChanges(entries))
}

// applyRemoteChanges is applyRemote, returning the changes.
func (r *Replica) applyRemoteChanges(entries []*Signed) []*Change {
	changes, err := r.commit(entries)
	if err != nil {
		r.log.Error("storing entries from peers", "err", err)
	}
	r.notify(changes)
	return changes
}

// applyGossiped is applyRemoteChanges for entries that came by pubsub or
// anti-entropy: those of broadcast kinds are applied at once and stored
// with the next commit, at most BehindFor later (commitBehind), not a
// disk sync each time a few arrive; their authors and every peer that
// took them keep them, and a node that dies before storing them pulls
// them again. Direct entries (a job's acks, which only their targets
// and the writers hold) are stored before they are applied, as ever.
func (r *Replica) applyGossiped(entries []*Signed) []*Change {
	entries = r.admitted(entries)
	var now, behind []*Signed
	for _, e := range entries {
		if r.cfg.Direct != nil && r.cfg.Direct(e.Key) {
			now = append(now, e)
		} else {
			behind = append(behind, e)
		}
	}
	var changes []*Change
	if len(now) > 0 {
		changes = r.applyRemoteChanges(now)
	}
	if len(behind) > 0 {
		c, err := r.commitBehind(behind)
		if err != nil {
			r.log.Error("applying entries from peers", "err", err)
		}
		r.notify(c)
		changes = append(changes, c...)
	}
	return changes
}

// admitted are the entries that ReplicaConfig.Admit takes, each asked
// with the state and the other entries of the batch to look in.
func (r *Replica) admitted(entries []*Signed) []*Signed {
	if r.cfg.Admit == nil {
		return entries
	}
	var batch map[string]*Signed
	held := func(key string) (*Signed, bool) {
		if batch == nil {
			batch = make(map[string]*Signed, len(entries))
			for _, e := range entries {
				if o := batch[e.Key]; o == nil || e.newer(o) {
					batch[e.Key] = e
				}
			}
		}
		if e := batch[key]; e != nil {
			if cur, ok := r.Version(key); !ok || e.newer(cur) {
				return e, !e.Deleted
			}
		}
		return r.Get(key)
	}
	out := entries[:0:0]
	for _, e := range entries {
		if err := r.cfg.Admit(e, held); err != nil {
			r.log.Debug("an entry the agent does not take", "key", e.Key, "author", e.Author, "err", err)
			continue
		}
		out = append(out, e)
	}
	return out
}

// collect drops old tombstones now and then.
func (r *Replica) collect() {
	t := time.NewTicker(r.cfg.CollectInterval)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		// Under the commit lock: a key written again between the two
		// steps must not be deleted from the store.
		r.commits.mu.Lock()
		r.mu.Lock()
		gone := r.state.Collect(r.now(), TombstoneGrace)
		r.mu.Unlock()
		err := r.store.Delete(gone...)
		r.commits.mu.Unlock()
		if err != nil {
			r.log.Warn("collecting tombstones", "err", err)
		}
	}
}

// Counters of refused input, by reason.
type counters struct {
	badSignature, badSigner, malformed, tooLarge, unauthorized, unknownKey, fromFuture, notAdmitted, valueRefused atomic.Int64
	pendingTooLarge, pendingFull, pendingTooSoon, authorFull                                                      atomic.Int64

	// Sync streams (see refuseSync): malformed in either direction,
	// entries sent that were not asked for, penalties given, pulls of
	// penalised peers refused, streams refused for want of capacity
	// (serving slots, or memory the resource manager would not grant,
	// either direction), and warnings not logged because one about the
	// same peer was logged less than warnEvery ago.
	syncMalformed, syncUnwanted, syncPenalised, syncPenaltyRefused, syncBusy, syncWarningsSuppressed atomic.Int64
	// This replica's own pulls not made: one from the same peer was in
	// flight, or maxPulling were (see pull). Streams served that brought
	// no whole first request in firstRequestTimeout (see stallCooldown).
	syncPullsSkipped, syncStalled atomic.Int64

	// Pushes (push.go) refused for want of a slot or from a penalised
	// peer, and cut short (the stream ended, or brought no whole entry
	// in firstRequestTimeout).
	pushBusy, pushCutShort atomic.Int64
}

func (c *counters) reject(err error) {
	switch {
	case errors.Is(err, ErrBadSig):
		c.badSignature.Add(1)
	case errors.Is(err, ErrBadSigner):
		c.badSigner.Add(1)
	case errors.Is(err, ErrTooLarge):
		c.tooLarge.Add(1)
	case errors.Is(err, ErrUnauthorized):
		c.unauthorized.Add(1)
	case errors.Is(err, ErrUnknownKey):
		c.unknownKey.Add(1)
	case errors.Is(err, ErrFromFuture):
		c.fromFuture.Add(1)
	case errors.Is(err, ErrPendingTooLarge):
		c.pendingTooLarge.Add(1)
	case errors.Is(err, ErrPendingFull):
		c.pendingFull.Add(1)
	case errors.Is(err, ErrPendingTooSoon):
		c.pendingTooSoon.Add(1)
	case errors.Is(err, ErrNotAdmitted):
		c.notAdmitted.Add(1)
	case errors.Is(err, ErrAuthorFull):
		c.authorFull.Add(1)
	case errors.Is(err, ErrValueRefused):
		c.valueRefused.Add(1)
	default:
		c.malformed.Add(1)
	}
}

// Rejected returns the counts of refused entries and sync streams by
// reason.
func (r *Replica) Rejected() map[string]int64 {
	c := &r.counters
	return map[string]int64{
		"bad_signature":            c.badSignature.Load(),
		"bad_signer":               c.badSigner.Load(),
		"malformed":                c.malformed.Load(),
		"too_large":                c.tooLarge.Load(),
		"unauthorized":             c.unauthorized.Load(),
		"unknown_key":              c.unknownKey.Load(),
		"from_future":              c.fromFuture.Load(),
		"not_admitted":             c.notAdmitted.Load(),
		"pending_too_large":        c.pendingTooLarge.Load(),
		"pending_full":             c.pendingFull.Load(),
		"pending_too_soon":         c.pendingTooSoon.Load(),
		"author_full":              c.authorFull.Load(),
		"value_refused":            c.valueRefused.Load(),
		"sync_malformed":           c.syncMalformed.Load(),
		"sync_unwanted":            c.syncUnwanted.Load(),
		"sync_penalised":           c.syncPenalised.Load(),
		"sync_penalty_refused":     c.syncPenaltyRefused.Load(),
		"sync_busy":                c.syncBusy.Load(),
		"sync_warnings_suppressed": c.syncWarningsSuppressed.Load(),
		"sync_pulls_skipped":       c.syncPullsSkipped.Load(),
		"sync_stalled":             c.syncStalled.Load(),
		"push_busy":                c.pushBusy.Load(),
		"push_cut_short":           c.pushCutShort.Load(),
	}
}

var _ io.Closer = (*Replica)(nil)
