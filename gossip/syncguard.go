package gossip

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/internal/slots"
)

// The bookkeeping that guards the sync protocol against hostile peers:
// who is cooling down, how many pulls are being served, which warnings
// were logged lately. Each type is safe for concurrent use and takes time
// as an argument; the Replica's shell passes r.now().

// SyncCooldown is how long a peer that broke the sync protocol (an entry
// that fails its checks, an entry not asked for, a malformed or oversized
// message) is shunned: this node neither pulls from it nor serves its
// pulls. Ten minutes turns a peer that answers every pull with forged
// entries from millions of signature checks a minute into one per ten
// minutes, and lets a peer penalised for an honest fault (a clock far
// ahead, a trust list that differs) back soon; meanwhile its entries still
// arrive by pubsub and through other peers' anti-entropy.
const SyncCooldown = 10 * time.Minute

// cooldown holds the peers in their sync cool-down, with its end.
type cooldown struct {
	mu    sync.Mutex
	until map[peer.ID]time.Time
}

// forgive ends every cool-down.
func (c *cooldown) forgive() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.until)
}

// penalise puts p in cool-down until now+d.
func (c *cooldown) penalise(p peer.ID, now time.Time, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.until == nil {
		c.until = map[peer.ID]time.Time{}
	}
	// Penalties are rare (one per peer per cool-down at most): dropping
	// the ended ones here keeps the map to the peers cooling down.
	for q, end := range c.until {
		if !now.Before(end) {
			delete(c.until, q)
		}
	}
	// A shorter penalty (a stall) does not cut a longer one short.
	if end, ok := c.until[p]; !ok || end.Before(now.Add(d)) {
		c.until[p] = now.Add(d)
	}
}

// active reports whether p is cooling down at now.
func (c *cooldown) active(p peer.ID, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	end, ok := c.until[p]
	return ok && now.Before(end)
}

// Bounds of the pulls this node serves at once. A pull takes milliseconds
// and a node pulls from one peer at a time (on joining the topic and every
// SyncInterval), so 16 at once serve a large fleet. Each holds at most one
// request of MaxSyncMessage and the response being written, so serving
// costs at most about 16 × (4 MiB + a response) of buffers whatever the
// resource manager allows (mocknet hosts, in the simulator, have none).
// One peer gets at most 2, so it cannot take every slot and starve the
// others' pulls for a SyncTimeout. Identities cost nothing, though: 8
// peers that each held 2 streams open took all 16, so half are kept for
// peers that count (ReplicaConfig.Counts).
const (
	maxServing        = 16
	maxServingPerPeer = 2
	servingReserved   = 8
)

// firstRequestTimeout bounds the wait for a stream's first whole request
// (a pull's first round, a push's entry); the rest of the stream keeps
// its own deadline. An honest peer sends it as the stream opens: a pull's
// first request is a few dozen bytes, a push at most MaxEntrySize. A
// stream that brings none in time, or ends before, stalled: it gave its
// slot to nobody for that long (see stallCooldown).
const firstRequestTimeout = 2 * time.Second

// nextRequestTimeout bounds, for a peer that does not count, each round
// of a pull after its first request: from the start of this node's
// answer until the next request has come whole, plus the answer's
// slowLinkTime. An honest puller reads
// the answer and asks again as soon as it has checked and stored what
// the answer brought (at most 2 MiB of entries: under a second of
// signature checks, and a store commit). Without it, such a peer held
// its serving slot for the stream's whole deadline (SyncTimeout, a
// minute) for one request a minute, by sending nothing or by not reading
// a large answer, and 4 identities (2 streams each) held every slot that
// is not kept for the nodes that count. One that is late stalled
// (sync_stalled, stallCooldown); a peer that counts has slots kept for
// it and keeps the stream's deadline.
const nextRequestTimeout = 10 * time.Second

// slowLinkTime is what sending n bytes adds to nextRequestTimeout: the
// time they take at 256 KiB/s (2 Mbit/s), so that an honest pending node
// on a slow link is not taken for one that does not read (a 4 MiB answer
// adds 16 s).
func slowLinkTime(n int) time.Duration {
	return time.Duration(n) * time.Second / (256 << 10)
}

// stallCooldown is the cool-down of a peer that does not count and
// stalled a stream: without one, a stream that sent one byte of a length
// prefix, held its slot to the deadline, ended cut short (not penalised)
// and was opened again at once. One minute makes each such stream cost
// 30 times its hold, while an honest peer that is slow only now and then
// (a starved machine, a pause) loses a minute of sync with this node, not
// SyncCooldown; a peer that counts is only counted (it has slots kept for
// it, its identity is not free, and a cool-down would also refuse its
// pushes and job hand-offs).
const stallCooldown = time.Minute

// Bounds of the pushes this node takes at once. A push is one entry: a
// node's farewell as it leaves, or a job target's ack to the job's writer
// (its running ack and final acks of parallel jobs may overlap), so a few
// per peer are plenty; a writer of a job to many targets takes many peers'
// at once.
// Half are kept for peers that count, as the pulls served are: 16
// identities holding 4 pushes each took them all.
const (
	maxPushing        = 64
	maxPushingPerPeer = 4
	pushingReserved   = 32
)

// Slots counts the streams being served, in all and by peer (see package
// slots): the sync and push servers use it, and other protocols' servers
// (NewSlots).
type Slots = slots.Slots

// warnEvery is how often a warning about one peer's sync streams is
// logged; the ones in between are only counted. A hostile peer can open
// streams as fast as it likes, and each would otherwise write a line.
const warnEvery = time.Minute

// maxWarnPeers bounds the peers warnLimit remembers.
const maxWarnPeers = 1024

// warnLimit lets through one warning per peer per interval.
type warnLimit struct {
	mu   sync.Mutex
	last map[peer.ID]warnSlot
}

type warnSlot struct {
	at   time.Time // when the last warning about the peer was let through
	held int       // warnings about it held back since
}

// allow reports whether a warning about p may be logged at now, and if so
// how many about p were held back since the last one, which the warning
// should say.
func (w *warnLimit) allow(p peer.ID, now time.Time, every time.Duration) (ok bool, held int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s, ok := w.last[p]; ok && now.Sub(s.at) < every {
		s.held++
		w.last[p] = s
		return false, 0
	}
	held = w.last[p].held
	if w.last == nil {
		w.last = map[peer.ID]warnSlot{}
	}
	if len(w.last) >= maxWarnPeers {
		for q, s := range w.last {
			if now.Sub(s.at) >= every {
				delete(w.last, q)
			}
		}
		if len(w.last) >= maxWarnPeers {
			// Over a thousand peers warned about within a minute: start
			// over rather than grow; at worst that many more lines.
			clear(w.last)
		}
	}
	w.last[p] = warnSlot{at: now}
	return true, held
}

// NewSlots allows max at once, perPeer of them from one peer.
func NewSlots(max, perPeer int) *Slots { return slots.New(max, perPeer) }
