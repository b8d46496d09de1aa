package gossip

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// SyncProtocol is anti-entropy over a stream: the dialler pulls, comparing
// every entry (Full); SyncSharedProtocol is the same in scope Shared
// (without the direct keys). The scope is the protocol's, so the messages
// are the same.
const (
	SyncProtocol       protocol.ID = "/tribe/sync/1.0.0"
	SyncSharedProtocol protocol.ID = "/tribe/sync-shared/1.0.0"
)

// syncProtocol is the protocol of scope sc.
func syncProtocol(sc Scope) protocol.ID {
	if sc == Shared {
		return SyncSharedProtocol
	}
	return SyncProtocol
}

// respondBudget bounds the entries in one response.
const respondBudget = 1 << 20

// SyncStats tells what one pull did.
type SyncStats struct {
	Rounds  int
	Sent    int // bytes sent by the puller
	Recv    int // bytes received by the puller
	Fetched int // entries received
	Applied int // entries that changed the state
	// Disagreed counts entries skipped as not for this node (see
	// disagreement), ValueRefused those of them refused for their value
	// (ReplicaConfig.Value) and AuthorFull those whose author holds as
	// many keys of their kind here as one may (ErrAuthorFull), which
	// maxDisagreements does not bound.
	Disagreed, ValueRefused, AuthorFull int
	// Shared counts entries this pull did not ask for because another
	// pull of this replica was fetching the same version (see fetching).
	Shared int
	// Skipped counts entries this pull did not ask for because a pull
	// refused that very version lately (see refusedVersions).
	Skipped int
}

// SyncTotals adds up this replica's pulls since it started: how many were
// made and failed, and the SyncStats of all of them (a failed pull counts
// what it did before it failed).
type SyncTotals struct {
	Pulls, Failed                        int64
	Rounds, Sent, Recv, Fetched, Applied int64
	Shared, Skipped                      int64
	// Relayed counts pulled entries passed on by pubsub (relayFresh).
	Relayed int64
}

// syncTotals is SyncTotals behind a lock: a pull adds to it once, at its
// end.
type syncTotals struct {
	mu sync.Mutex
	t  SyncTotals
}

func (s *syncTotals) add(st SyncStats, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.t.Pulls++
	if err != nil {
		s.t.Failed++
	}
	s.t.Rounds += int64(st.Rounds)
	s.t.Sent += int64(st.Sent)
	s.t.Recv += int64(st.Recv)
	s.t.Fetched += int64(st.Fetched)
	s.t.Applied += int64(st.Applied)
	s.t.Shared += int64(st.Shared)
	s.t.Skipped += int64(st.Skipped)
}

// SyncTotals returns the totals of this replica's pulls. Safe for
// concurrent use.
func (r *Replica) SyncTotals() SyncTotals {
	r.pulls.mu.Lock()
	defer r.pulls.mu.Unlock()
	t := r.pulls.t
	t.Relayed = r.relayed.Load()
	return t
}

// ErrPenalised is a pull not made because the peer is in its sync
// cool-down (see SyncCooldown).
var ErrPenalised = errors.New("gossip: peer penalised for breaking the sync protocol")

// errEntryRefused marks an entry of a sync response that failed the checks
// pubsub entries get; the reason is wrapped too.
var errEntryRefused = errors.New("gossip: sync entry refused")

// Penalised reports whether p is in its sync cool-down: it broke the sync
// protocol less than SyncCooldown ago, and this node neither pulls from it
// nor serves its pulls. Safe for concurrent use. The node consults it
// before job hand-offs and plugin fetches (pushes check it here). Gossipsub's peer
// scoring (score.go) counts only rejected pubsub entries, not this.
func (r *Replica) Penalised(p peer.ID) bool {
	return r.penalties.active(p, r.now())
}

// serveSync answers pulls in scope sc: read a request, answer, until the
// puller closes or the deadline passes. Penalised peers and pulls beyond
// the slots (syncguard.go) are refused with a reset; the request buffers
// are reserved on the stream's resource scope (see ReadMsg).
func (r *Replica) serveSync(sc Scope) network.StreamHandler {
	return func(s network.Stream) { r.serveSyncIn(s, sc) }
}

func (r *Replica) serveSyncIn(s network.Stream, sc Scope) {
	p := s.Conn().RemotePeer()
	if r.Penalised(p) {
		r.counters.syncPenaltyRefused.Add(1)
		r.log.Debug("sync: refused a pull from a penalised peer", "peer", p)
		s.Reset()
		return
	}
	counts := r.counts(p)
	if !counts {
		// The direct entries (job acks: their output heads) are for
		// the nodes that count: a peer that does not is answered in
		// scope Shared whatever it asks, and its wants of direct
		// entries as not held.
		sc = Shared
	}
	if !r.serving.AcquireFor(p, counts) {
		r.counters.syncBusy.Add(1)
		r.log.Debug("sync: refused a pull, too many served at once", "peer", p)
		s.Reset()
		return
	}
	defer r.serving.Release(p)
	s.SetDeadline(time.Now().Add(r.cfg.SyncTimeout))
	// The first request must come whole within firstRequest, and from a
	// peer that does not count each answer must be read and the next
	// request come within nextRequest (else it held its slot for the
	// stream's whole deadline for one request): a timer rather than a
	// deadline, which bounds the whole stream (and which some
	// transports, mocknet's, ignore).
	var late atomic.Bool
	wait := time.AfterFunc(r.firstRequest, func() { late.Store(true); s.Reset() })
	defer wait.Stop()
	br := bufio.NewReader(s)
	for round := range maxRounds + 1 {
		b, held, err := ReadMsg(br, s.Scope())
		wait.Stop()
		if err != nil {
			// A pull that ends between rounds closes its stream: only a
			// request that did not come in time is a stall then.
			if (round == 0 || late.Load()) && isStall(err) {
				r.stalled(s, "sync", counts, err)
				return
			}
			r.refuseSync(s, "serve", err)
			return
		}
		req, err := DecodeRequest(b)
		s.Scope().ReleaseMemory(held)
		if err == nil {
			err = CheckRequest(req)
		}
		if err != nil {
			r.refuseSync(s, "serve", err)
			return
		}
		msg := EncodeResponse(r.respond(req, sc, counts))
		if !counts {
			wait.Reset(r.nextRequest + slowLinkTime(len(msg)))
		}
		if err := WriteMsg(s, msg); err != nil {
			if late.Load() { // the answer not read in time
				r.stalled(s, "sync", counts, err)
				return
			}
			s.Reset()
			return
		}
	}
	s.Close()
}

// respondChunk is how many probes, or wants, a response takes in per
// hold of r.mu (see respond).
const respondChunk = 512

// respond answers req in scope sc as State.Respond does, respondChunk
// probes or wants at a time under r.mu: a request may make the responder
// walk the whole digest (CheckRequest bounds it to one pass), and under
// one hold of the lock such a walk, 57 ms at 50,000 keys, held up every
// Get, write and applied entry. Between chunks the state may change:
// each reply is of the state at its time, and the puller's next round
// compares again. Unless direct (the puller counts), direct entries are
// not served.
func (r *Replica) respond(req SyncRequest, sc Scope, direct bool) SyncResponse {
	var resp SyncResponse
	size := 0
	for i := 0; i < len(req.Probes); i += respondChunk {
		chunk := req.Probes[i:min(i+respondChunk, len(req.Probes))]
		r.mu.Lock()
		replies, sizeNow, answered := r.state.replyNodes(chunk, sc, size, respondNodeBudget)
		r.mu.Unlock()
		resp.Nodes, size = append(resp.Nodes, replies...), sizeNow
		if answered < len(chunk) {
			break // the budget is spent
		}
	}
	used := 0
	for i := 0; i < len(req.Want); i += respondChunk {
		chunk := req.Want[i:min(i+respondChunk, len(req.Want))]
		r.mu.Lock()
		served, entries, usedNow := r.state.serveWants(chunk, used, respondBudget, direct)
		r.mu.Unlock()
		resp.Served, resp.Entries, used = resp.Served+served, append(resp.Entries, entries...), usedNow
		if served < len(chunk) {
			break
		}
	}
	return resp
}

// SyncWith pulls from p everything this replica lacks that the two keep
// (ScopeWith). A pull stops at the first thing p sends that the protocol
// does not allow (see refuseSync), and a penalised p is not pulled from
// (ErrPenalised).
func (r *Replica) SyncWith(ctx context.Context, p peer.ID) (SyncStats, error) {
	return r.SyncScoped(ctx, p, r.ScopeWith(p))
}

// ScopeWith is the scope of this replica's pulls from p: Full when both
// keep the direct keys (trusted writers; every node in a cluster without
// a trust list), else Shared.
func (r *Replica) ScopeWith(p peer.ID) Scope {
	t := r.Trust()
	if r.cfg.Direct == nil || t.Open() || t.Trusted(r.self) && t.Trusted(p) {
		return Full
	}
	return Shared
}

// SyncScoped pulls from p in scope sc: Full also brings the direct
// entries p holds, as a node asked about a job pulls from its writer.
func (r *Replica) SyncScoped(ctx context.Context, p peer.ID, sc Scope) (st SyncStats, err error) {
	return r.pullFrom(ctx, p, sc, func(sc Scope) SyncRequest {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.state.StartPull(sc)
	})
}

// FetchKeys asks p for the entries of keys, whatever their scope, and
// takes those p holds: one round, a signature check per entry, no
// digest walked. A trusted writer asks a job's target so for its ack.
func (r *Replica) FetchKeys(ctx context.Context, p peer.ID, keys ...string) (SyncStats, error) {
	want := make([]uint64, 0, len(keys))
	seen := make(map[uint64]bool, len(keys))
	for _, k := range keys {
		if kh := keyHash(k); !seen[kh] {
			seen[kh] = true
			want = append(want, kh)
		}
	}
	return r.pullFrom(ctx, p, Full, func(Scope) SyncRequest { return SyncRequest{Want: want} })
}

// pullFrom runs a pull from p in scope sc (Full if p serves only that),
// from the request first makes for the scope.
func (r *Replica) pullFrom(ctx context.Context, p peer.ID, sc Scope, first func(Scope) SyncRequest) (st SyncStats, err error) {
	if r.Penalised(p) {
		return st, fmt.Errorf("gossip: sync with %s: %w", p, ErrPenalised)
	}
	defer func() { r.pulls.add(st, err) }()
	ctx, cancel := context.WithTimeout(ctx, r.cfg.SyncTimeout)
	defer cancel()
	protos := []protocol.ID{syncProtocol(sc)}
	if sc == Shared {
		// A peer of an earlier version serves only the full protocol:
		// pulled from so, it compares everything, as it did.
		protos = append(protos, SyncProtocol)
	}
	s, err := r.h.NewStream(ctx, p, protos...)
	if err != nil {
		return st, fmt.Errorf("gossip: sync with %s: %w", p, err)
	}
	if s.Protocol() == SyncProtocol {
		sc = Full
	}
	defer s.Close()
	if dl, ok := ctx.Deadline(); ok {
		s.SetDeadline(dl)
	}
	// Reads do not watch ctx: a closing replica or a cancelled caller
	// resets the stream instead of waiting out the deadline.
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	br := bufio.NewReader(s)
	pl := &pulling{id: r.pullIDs.Add(1), scope: sc, claimed: map[uint64]ItemSummary{}}
	defer r.endClaims(pl)
	req := first(sc)
	for st.Rounds = 1; st.Rounds <= maxRounds; st.Rounds++ {
		next, done, err := r.pullRound(s, br, req, pl, &st)
		if err != nil {
			if errors.Is(ctx.Err(), context.Canceled) {
				s.Reset() // our own doing, not the peer's
			} else {
				r.refuseSync(s, "pull", err)
			}
			return st, fmt.Errorf("gossip: sync with %s: %w", p, err)
		}
		if done {
			s.CloseWrite()
			r.endClaims(pl) // before waiting: a waiting pull holds no claim
			r.awaitShared(ctx, pl)
			return st, nil
		}
		req = next
	}
	return st, fmt.Errorf("gossip: sync with %s: no end after %d rounds", p, maxRounds)
}

// pulling is one pull's part in the replica's fetching: its id, its scope,
// the entries it claimed, by key hash, and those it left to other pulls.
type pulling struct {
	id      uint64
	scope   Scope
	claimed map[uint64]ItemSummary
	shared  []ItemSummary
}

// awaitShared waits until the entries pl left to other pulls are held
// here, or the pulls that claimed them have given up (or ctx ends): a pull
// that returns has brought this node what its peer holds, as its caller
// expects (a node asked about a job reads its state right after pulling
// from the writer). Best effort: an entry whose pull failed is fetched at
// the next pull.
func (r *Replica) awaitShared(ctx context.Context, pl *pulling) {
	for waited := false; len(pl.shared) > 0; {
		now := r.now()
		r.mu.Lock()
		v := r.state.view(pl.scope)
		pending := pl.shared[:0]
		for _, it := range pl.shared {
			if _, mine, ok := v.lookup(it.KeyHash); ok && mine == it.VersionHash {
				continue // held: by that pull, or by pubsub meanwhile
			}
			if c, ok := r.fetching.by[it]; ok && c.pull != pl.id && now.Sub(c.at) < fetchStale {
				pending = append(pending, it)
			}
		}
		pl.shared = pending
		released := r.fetching.releases()
		r.mu.Unlock()
		if len(pending) == 0 {
			return
		}
		if !waited {
			waited = true
			r.sharedWaits.Add(1)
		}
		t := time.NewTimer(fetchStale) // a claim not released goes stale
		select {
		case <-ctx.Done():
		case <-released:
		case <-t.C:
		}
		t.Stop()
		if ctx.Err() != nil {
			return
		}
	}
}

// releaseClaims ends pl's claims on the entries of the key hashes khs.
func (r *Replica) releaseClaims(pl *pulling, khs []uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, kh := range khs {
		if it, ok := pl.claimed[kh]; ok {
			r.fetching.release(pl.id, it)
			delete(pl.claimed, kh)
		}
	}
}

// endClaims ends every claim of pl, as its pull ends.
func (r *Replica) endClaims(pl *pulling) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, it := range pl.claimed {
		r.fetching.release(pl.id, it)
	}
	clear(pl.claimed)
}

// pullRound sends req and takes in the answer: it checks the response
// against req, applies its entries and computes the next request, which
// leaves out what another pull is fetching.
func (r *Replica) pullRound(s network.Stream, br *bufio.Reader, req SyncRequest, pl *pulling, st *SyncStats) (next SyncRequest, done bool, err error) {
	body := EncodeRequest(req)
	if err := WriteMsg(s, body); err != nil {
		return next, false, err
	}
	st.Sent += len(body)
	b, held, err := ReadMsg(br, s.Scope())
	if err != nil {
		return next, false, err
	}
	defer s.Scope().ReleaseMemory(held)
	st.Recv += len(b)
	resp, err := DecodeResponse(b)
	if err == nil {
		err = CheckResponse(req, resp)
	}
	if err != nil {
		return next, false, err
	}
	st.Fetched += len(resp.Entries)
	applied, err := r.applyFetched(s.Conn().RemotePeer(), resp.Entries, ServedWants(req, resp), st)
	r.releaseClaims(pl, req.Want[:resp.Served]) // applied, or to be fetched again
	st.Applied += applied
	if err != nil {
		return next, false, err
	}
	now := r.now()
	r.mu.Lock()
	next, done = r.state.NextPull(req, resp, pl.scope, func(it ItemSummary) bool {
		if r.refused.has(it, now) {
			st.Skipped++ // refused lately: not asked for again
			return false
		}
		if !r.fetching.claim(pl.id, it, now) {
			st.Shared++
			pl.shared = append(pl.shared, it)
			return false
		}
		pl.claimed[it.KeyHash] = it
		return true
	})
	r.mu.Unlock()
	return next, done, nil
}

// maxDisagreements bounds the entries one pull skips for reasons an honest
// peer can have (disagreement): past it the pull ends, unpenalised.
const maxDisagreements = 64

// errDisagreed ends a pull that met more than maxDisagreements entries
// this node refuses for reasons an honest peer can have.
var errDisagreed = errors.New("gossip: too many entries this node does not accept")

// disagreement reports whether err refuses a well-signed entry for a
// reason an honest peer can have: its key kind is unknown here, its author
// is not authorised by this node's trust list (or not admitted, as far as
// this node knows yet), it is ahead of this node's clock, its value is
// one this version refuses (ReplicaConfig.Value) and an earlier one took,
// or its author has as many keys of its kind held here as one may (the
// peer may hold others).
func disagreement(err error) bool {
	return errors.Is(err, ErrUnknownKey) || errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrFromFuture) ||
		errors.Is(err, ErrNotAdmitted) || errors.Is(err, ErrValueRefused) || errors.Is(err, ErrAuthorFull)
}

// applyFetched checks the entries of a sync response as pubsub entries are
// checked, and that each is for one of wanted (each at most once), and
// applies them. It stops at the first it refuses and returns why
// (errEntryRefused and the reason, or ErrUnwanted): a responder that sent
// it broke the protocol, and checking the rest would only spend more CPU
// on its word. The entries checked before it are applied, and the fresh
// ones from's own (see relayFresh) are passed on.
func (r *Replica) applyFetched(from peer.ID, raws [][]byte, wanted map[uint64]bool, st *SyncStats) (int, error) {
	now := r.now()
	ok := make([]*Signed, 0, len(raws))
	var refused error
	disagreed := st.Disagreed - st.ValueRefused - st.AuthorFull
	// skip counts e, refused for err, and remembers not to ask for its
	// version again for the next ttl.
	skip := func(e *Signed, err error, ttl time.Duration) {
		st.Disagreed++
		r.counters.reject(err)
		r.mu.Lock()
		r.refused.add(keyHash(e.Key), versionHash(e), now, ttl)
		r.mu.Unlock()
	}
	for _, raw := range raws {
		e, err := Open(raw)
		if err == nil {
			err = r.check(e, now)
		}
		if errors.Is(err, ErrValueRefused) {
			// A value this version refuses, which an earlier one may have
			// taken: skipped, counted, and remembered for long (Value is
			// pure), outside the budget below, so that a stranger's many
			// bad records held by older peers cannot end every pull.
			st.ValueRefused++
			skip(e, err, valueRefusedFor)
			continue
		}
		if errors.Is(err, ErrAuthorFull) {
			// Another key of an author this node holds as many of as
			// one may: honest peers hold other such keys (one that
			// counts can hand each node a set of its own), so these are
			// outside the budget too, or they would end every pull.
			// Remembered for refusedFor only: a slot frees as a
			// tombstone of the author's is collected.
			st.AuthorFull++
			skip(e, err, refusedFor)
			continue
		}
		if err != nil && disagreement(err) {
			// Signed and well formed, but not for this node: an honest
			// peer can hold it (another version's key kinds, a trust list
			// being rolled out, a clock ahead of ours). Skipped, counted,
			// and only so many per pull.
			if disagreed < maxDisagreements {
				disagreed++
				skip(e, err, refusedFor)
				continue
			}
			refused = fmt.Errorf("%w after %d: %w", errDisagreed, disagreed, err)
			break
		}
		if err != nil {
			refused = fmt.Errorf("%w: %w", errEntryRefused, err)
			break
		}
		kh := keyHash(e.Key)
		if !wanted[kh] {
			refused = fmt.Errorf("%w: %s", ErrUnwanted, e.Key)
			break
		}
		delete(wanted, kh)
		// Raw points into the response's buffer (up to MaxSyncMessage):
		// a copy lets the buffer go with the round, not live as long as
		// the entry does.
		e.Raw = bytes.Clone(e.Raw)
		ok = append(ok, e)
	}
	changes := r.applyGossiped(ok)
	r.relayFresh(from, changes, now)
	return len(changes), refused
}

// relayFresh is how recent an entry pulled from its own author must be
// to be passed on, and maxRelay how many of one pull are.
const (
	relayFresh = 10 * time.Second
	maxRelay   = 8
)

// relayFresh publishes the entries just pulled from from that from wrote
// itself in the last relayFresh: a node that just started (its record,
// its policy memberships) writes them before any peer is in its topic and
// publishes them only once its mesh forms, two heartbeats later (see
// holdUnsent); the peers it syncs with on joining have meshes already,
// and passing them on spreads them at once. Message IDs are content
// hashes, so the author's own publish later is a duplicate. At most
// maxRelay of a pull: what a node writes as it starts.
func (r *Replica) relayFresh(from peer.ID, changes []*Change, now time.Time) {
	// Only once this node's own mesh has had unsentDelay to form: passed
	// on sooner, as when a whole fleet starts at once, the entry reaches
	// few nodes, and its author's own publish later is a duplicate that
	// every one of those drops, so it goes no further.
	since := r.meshSince.Load()
	if r.topic == nil || since == 0 || now.Sub(time.Unix(0, since)) < unsentDelay {
		return
	}
	for _, e := range toRelay(from, changes, now, r.cfg.Quiet) {
		r.relayed.Add(1)
		r.publish(r.ctx, e)
	}
}

// toRelay is what relayFresh passes on of the changes a pull from from
// made: from's own entries written in the last relayFresh, at most
// maxRelay, none under a quiet key. Relayed, a job's ack that another node
// pulled from its target within seconds (anti-entropy runs every 30 s
// with a random peer) went to every node after all: with 25 targets, about
// 18 floods a job, each verified and stored by all 25 nodes.
func toRelay(from peer.ID, changes []*Change, now time.Time, quiet func(string) bool) []*Signed {
	var out []*Signed
	for _, c := range changes {
		e := c.New
		if e == nil || e.Author != from || now.Sub(e.HLC.Wall()) >= relayFresh || (quiet != nil && quiet(e.Key)) {
			continue
		}
		if out = append(out, e); len(out) == maxRelay {
			break
		}
	}
	return out
}

// refuseSync ends sync stream s, which failed with err ("pull" or "serve"
// says which side this node was on), counting and penalising as err
// deserves:
//   - an entry refused, an entry not asked for, a malformed or oversized
//     message: the peer broke the protocol; counted by reason, and the
//     peer penalised for SyncCooldown;
//   - a message cut short (the stream ended, failed or timed out inside
//     it): counted as malformed but not penalised, since an honest peer
//     that crashes or loses its connection does the same;
//   - no memory for a message: counted as busy;
//   - anything else (the stream's end or failure between messages): just
//     reset.
//
// One warning per peer per warnEvery is logged; the rest are counted.
func (r *Replica) refuseSync(s network.Stream, side string, err error) {
	p := s.Conn().RemotePeer()
	defer s.Reset() // after counting: a peer that sees the reset sees the counts
	penalise := true
	switch {
	case errors.Is(err, errDisagreed):
		r.counters.reject(err)
		penalise = false
	case errors.Is(err, errEntryRefused):
		r.counters.reject(err)
	case errors.Is(err, ErrUnwanted):
		r.counters.syncUnwanted.Add(1)
	case errors.Is(err, ErrBadSyncMessage):
		r.counters.syncMalformed.Add(1)
	case errors.Is(err, ErrSyncTruncated):
		r.counters.syncMalformed.Add(1)
		penalise = false
	case errors.Is(err, ErrSyncNoMemory):
		r.counters.syncBusy.Add(1)
		r.log.Debug("sync: refused a stream, no memory for its message", "side", side, "peer", p, "err", err)
		return
	default:
		r.log.Debug("sync: stream failed", "side", side, "peer", p, "err", err)
		return
	}
	msg, args := "sync: malformed stream", []any{"side", side, "peer", p, "err", err}
	if penalise {
		r.penalties.penalise(p, r.now(), SyncCooldown)
		r.counters.syncPenalised.Add(1)
		msg = "sync: peer broke the protocol; neither pulling from it nor serving it for the cool-down"
		args = append(args, "cooldown", SyncCooldown)
	}
	r.warnLimited(p, msg, args)
}

// warnLimited logs a warning about p's sync or push streams, at most one
// per peer every warnEvery: the next one says how many were held back.
func (r *Replica) warnLimited(p peer.ID, msg string, args []any) {
	ok, held := r.warns.allow(p, r.now(), warnEvery)
	if !ok {
		r.counters.syncWarningsSuppressed.Add(1)
		return
	}
	if held > 0 {
		args = append(args, "suppressed", held)
	}
	r.log.Warn(msg, args...)
}

// isStall reports whether err, ending a stream before its first whole
// request, is a stall: anything but a protocol break (penalised as such)
// or this node's own want of memory.
func isStall(err error) bool {
	return !errors.Is(err, ErrBadSyncMessage) && !errors.Is(err, ErrSyncNoMemory)
}

// stalled resets s, served to a peer that sent no whole first request in
// firstRequest (what says which protocol: "sync" or "push"), counts it,
// and puts the peer in its cool-down for stallCooldown unless it counts.
// The counter is the protocol's: sync_stalled, push_cut_short.
func (r *Replica) stalled(s network.Stream, what string, counts bool, err error) {
	p := s.Conn().RemotePeer()
	defer s.Reset()
	if what == "push" {
		r.counters.pushCutShort.Add(1)
	} else {
		r.counters.syncStalled.Add(1)
	}
	msg, args := what+": a stream brought no whole request in time", []any{"peer", p, "err", err}
	if !counts {
		r.penalties.penalise(p, r.now(), stallCooldown)
		r.counters.syncPenalised.Add(1)
		msg = what + ": a peer that does not count stalled a stream; neither pulling from it nor serving it for the cool-down"
		args = append(args, "cooldown", stallCooldown)
	}
	r.warnLimited(p, msg, args)
}

// onTopicJoin pulls from each peer as it joins the state topic, and
// publishes the entries written while no peer was there. On topic join
// rather than on connect: an entry written after the connect-time sync but
// before pubsub knew the peer subscribed would otherwise reach it by
// neither, until the next periodic sync.
func (r *Replica) onTopicJoin(events *pubsub.TopicEventHandler) {
	defer events.Cancel()
	for {
		ev, err := events.NextPeerEvent(r.ctx)
		if err != nil {
			return
		}
		if ev.Type == pubsub.PeerJoin {
			if r.meshSince.CompareAndSwap(0, r.now().UnixNano()) {
				r.spawn(r.pullWhileJoining)
			}
			r.spawn(r.publishUnsent)
			r.spawnPull(ev.Peer)
		}
	}
}

// pullPeriodically pulls from a random connected peer every SyncInterval.
func (r *Replica) pullPeriodically() {
	tick := time.NewTimer(r.jitter(r.cfg.SyncInterval))
	defer tick.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-tick.C:
			if p, ok := r.randomPeer(); ok {
				r.spawnPull(p)
			}
			tick.Reset(r.jitter(r.cfg.SyncInterval))
		}
	}
}

// Pulls while a node joins (pullWhileJoining): joinPull apart, at most
// maxJoinPulls. Agent processes joining one seed on loopback, until every
// agent listed all alive, three runs each, alternated: 20 agents 0.73–0.87 s
// at 200 ms against 1.03–1.19 s at 500 ms, with the same CPU per agent
// (49–58 against 57–70 ms); 50 agents 2.20–2.66 s against 2.33–2.49 s
// (CPU-bound: every agent shares 2 cores).
const (
	joinPull     = 200 * time.Millisecond
	maxJoinPulls = 20
)

// pullWhileJoining pulls from a random peer every joinPull from the moment
// the first peer joins the topic until a pull at least unsentDelay later
// brings nothing new, or maxJoinPulls were made. The pull on topic join
// (onTopicJoin) brings what that peer held then, not the records of the
// nodes that reach it after: when many nodes join one seed, or a fleet
// starts at once, those came only with their authors' held publishes
// (unsentDelay) and the meshes that had just formed, or the next periodic
// pull. Measured with 20 agent processes joining one seed on loopback,
// when these pulls were added (500 ms apart): every agent listed all 20
// alive 1.5 s after they started, 3.2 s without them.
func (r *Replica) pullWhileJoining() {
	start := r.now()
	t := time.NewTimer(joinPull)
	defer t.Stop()
	for range maxJoinPulls {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		if p, ok := r.randomPeer(); ok {
			st, err := r.pull(p)
			if err == nil && st.Applied == 0 && r.now().Sub(start) >= unsentDelay {
				return
			}
		}
		t.Reset(joinPull)
	}
}

// Bounds of the replica's own pulls (topic joins, periodic, joining,
// SetTrust): one per peer at a time and maxPulling in all. pubsub raises a
// topic join each time a peer subscribes again: a peer that toggled its
// subscription 200 times and never answered held 201 pulls open at once,
// each a stream and a goroutine for SyncTimeout. A pull not made finds
// the one in flight bringing the same. Half the slots are kept for peers
// that count, so that peers anyone can make, never answering, cannot
// hold them all.
const (
	maxPulling        = 16
	maxPullingPerPeer = 1
	pullingReserved   = 8
)

// errPullInFlight is a pull not made: one from the same peer is in
// flight, or maxPulling are.
var errPullInFlight = errors.New("gossip: a pull from the peer is in flight, or too many are")

// startPull takes a pull slot for p, counting a pull not made.
func (r *Replica) startPull(p peer.ID) bool {
	if r.pulling.AcquireFor(p, r.counts(p)) {
		return true
	}
	r.counters.syncPullsSkipped.Add(1)
	return false
}

// endPull gives p's pull slot back and starts a pull that waits for one.
func (r *Replica) endPull(p peer.ID) {
	r.pulling.Release(p)
	r.spawnQueuedPull()
}

// spawnPull pulls from p on a goroutine of its own, if a slot is free
// (taken before the goroutine starts, so pulls that wait cost none);
// else the pull waits for one (queuePull).
func (r *Replica) spawnPull(p peer.ID) {
	if !r.startPull(p) {
		r.queuePull(p)
		return
	}
	r.spawn(func() {
		defer r.endPull(p)
		r.pullNow(p)
	})
}

// maxQueuedPulls bounds the peers whose pull waits for a slot.
const maxQueuedPulls = 1024

// queuePull has a pull from p made once a slot is free, unless one from
// p waits already or maxQueuedPulls do. A pull spawnPull could not make
// at once used to be dropped on the word that one in flight brings the
// same: but one from another peer brings other entries, and one from p
// that began before p's latest writes does not bring those. In a join
// storm the pulls that topic joins asked for were lost past the 16 in
// flight, and entries published before the mesh formed waited for the
// periodic sync: 50 agents joining one seed took 8–12 s to list each
// other, against 2 s with no bound on pulls.
func (r *Replica) queuePull(p peer.ID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.queued == nil {
		r.queued = map[peer.ID]bool{}
	}
	if r.queued[p] || len(r.queued) >= maxQueuedPulls {
		return
	}
	r.queued[p] = true
	r.queue = append(r.queue, p)
}

// spawnQueuedPull starts the first waiting pull that can take a slot
// now; pulls from peers no longer connected are dropped, the others keep
// their place.
func (r *Replica) spawnQueuedPull() {
	if r.ctx == nil || r.ctx.Err() != nil {
		return // not started, or closing
	}
	var next peer.ID
	r.mu.Lock()
	kept := r.queue[:0]
	for _, p := range r.queue {
		switch {
		case next != "":
			kept = append(kept, p)
		case r.h.Network().Connectedness(p) != network.Connected:
			delete(r.queued, p)
		case r.pulling.AcquireFor(p, r.counts(p)):
			delete(r.queued, p)
			next = p
		default:
			kept = append(kept, p) // p's own pull is in flight
		}
	}
	clear(r.queue[len(kept):])
	r.queue = kept
	r.mu.Unlock()
	if next != "" {
		r.spawn(func() {
			defer r.endPull(next)
			r.pullNow(next)
		})
	}
}

// pull pulls from p if a slot is free (see maxPulling).
func (r *Replica) pull(p peer.ID) (SyncStats, error) {
	if !r.startPull(p) {
		return SyncStats{}, errPullInFlight
	}
	defer r.endPull(p)
	return r.pullNow(p)
}

func (r *Replica) pullNow(p peer.ID) (SyncStats, error) {
	st, err := r.SyncWith(r.ctx, p)
	if err != nil {
		r.log.Debug("sync failed", "peer", p, "err", err)
		return st, err
	}
	if st.Applied > 0 {
		r.log.Debug("sync", "peer", p, "rounds", st.Rounds, "applied", st.Applied, "bytes", st.Sent+st.Recv)
	}
	return st, nil
}

func (r *Replica) randomPeer() (peer.ID, bool) {
	var candidates []peer.ID
	for _, p := range r.h.Network().Peers() {
		if r.Penalised(p) {
			continue // a pull would not be made: try one that will
		}
		if ok, _ := r.h.Peerstore().SupportsProtocols(p, SyncProtocol, SyncSharedProtocol); len(ok) > 0 {
			candidates = append(candidates, p)
		}
	}
	if len(candidates) == 0 {
		return "", false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return candidates[r.rng.IntN(len(candidates))], true
}

func (r *Replica) jitter(d time.Duration) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return time.Duration(float64(d) * (0.8 + 0.4*r.rng.Float64()))
}
