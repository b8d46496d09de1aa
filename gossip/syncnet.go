package gossip

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// SyncProtocol is anti-entropy over a stream: the dialler pulls.
const SyncProtocol protocol.ID = "/tribe/sync/1.0.0"

// respondBudget bounds the entries in one response.
const respondBudget = 1 << 20

// SyncStats tells what one pull did.
type SyncStats struct {
	Rounds  int
	Sent    int // bytes sent by the puller
	Recv    int // bytes received by the puller
	Fetched int // entries received
	Applied int // entries that changed the state
}

// serveSync answers pulls: read a request, answer, until the puller
// closes or the deadline passes.
func (r *Replica) serveSync(s network.Stream) {
	defer s.Close()
	s.SetDeadline(time.Now().Add(r.cfg.SyncTimeout))
	br := bufio.NewReader(s)
	for range maxRounds + 1 {
		// The request's buffer is reserved on the stream's resource
		// scope while it is read and decoded (see ReadMsg).
		b, held, err := ReadMsg(br, s.Scope())
		if err != nil {
			if !errors.Is(err, io.EOF) {
				r.log.Debug("sync: read request", "peer", s.Conn().RemotePeer(), "err", err)
			}
			return
		}
		req, err := DecodeRequest(b)
		s.Scope().ReleaseMemory(held)
		if err != nil {
			r.counters.syncErrors.Add(1)
			r.log.Warn("sync: bad request", "peer", s.Conn().RemotePeer(), "err", err)
			s.Reset()
			return
		}
		r.mu.Lock()
		resp := r.state.Respond(req, respondBudget)
		r.mu.Unlock()
		if err := WriteMsg(s, EncodeResponse(resp)); err != nil {
			return
		}
	}
}

// SyncWith pulls from p everything this replica lacks.
func (r *Replica) SyncWith(ctx context.Context, p peer.ID) (SyncStats, error) {
	var st SyncStats
	ctx, cancel := context.WithTimeout(ctx, r.cfg.SyncTimeout)
	defer cancel()
	s, err := r.h.NewStream(ctx, p, SyncProtocol)
	if err != nil {
		return st, fmt.Errorf("gossip: sync with %s: %w", p, err)
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
	r.mu.Lock()
	req := r.state.StartPull()
	r.mu.Unlock()
	for st.Rounds = 1; st.Rounds <= maxRounds; st.Rounds++ {
		body := EncodeRequest(req)
		if err := WriteMsg(s, body); err != nil {
			return st, fmt.Errorf("gossip: sync with %s: %w", p, err)
		}
		st.Sent += len(body)
		b, held, err := ReadMsg(br, s.Scope())
		if err != nil {
			return st, fmt.Errorf("gossip: sync with %s: %w", p, err)
		}
		st.Recv += len(b)
		resp, err := DecodeResponse(b)
		if err != nil {
			s.Scope().ReleaseMemory(held)
			s.Reset()
			r.counters.syncErrors.Add(1)
			return st, err
		}
		st.Fetched += len(resp.Entries)
		st.Applied += r.applyFetched(resp.Entries)
		s.Scope().ReleaseMemory(held)
		r.mu.Lock()
		next, done := r.state.NextPull(req, resp)
		r.mu.Unlock()
		if done {
			s.CloseWrite()
			return st, nil
		}
		req = next
	}
	return st, fmt.Errorf("gossip: sync with %s: no end after %d rounds", p, maxRounds)
}

// applyFetched checks entries from a sync like pubsub entries, counts the
// refused, and applies the rest.
func (r *Replica) applyFetched(raws [][]byte) int {
	now := r.now()
	ok := make([]*Signed, 0, len(raws))
	for _, raw := range raws {
		e, err := Open(raw)
		if err == nil {
			err = r.state.Check(e, now)
		}
		if err != nil {
			r.counters.reject(err)
			continue
		}
		// Raw points into the response's buffer (up to MaxSyncMessage):
		// a copy lets the buffer go with the round, not live as long as
		// the entry does.
		e.Raw = bytes.Clone(e.Raw)
		ok = append(ok, e)
	}
	return r.applyRemote(ok)
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
			r.spawn(r.publishUnsent)
			r.spawn(func() { r.pull(ev.Peer) })
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
				r.spawn(func() { r.pull(p) })
			}
			tick.Reset(r.jitter(r.cfg.SyncInterval))
		}
	}
}

func (r *Replica) pull(p peer.ID) {
	st, err := r.SyncWith(r.ctx, p)
	if err != nil {
		r.log.Debug("sync failed", "peer", p, "err", err)
		return
	}
	if st.Applied > 0 {
		r.log.Debug("sync", "peer", p, "rounds", st.Rounds, "applied", st.Applied, "bytes", st.Sent+st.Recv)
	}
}

func (r *Replica) randomPeer() (peer.ID, bool) {
	var candidates []peer.ID
	for _, p := range r.h.Network().Peers() {
		if ok, _ := r.h.Peerstore().SupportsProtocols(p, SyncProtocol); len(ok) > 0 {
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
