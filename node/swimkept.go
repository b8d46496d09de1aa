package node

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip/swim"
)

// Pings between connected peers (probes of neighbours and gossip) go on a
// stream kept between them. One exchange on a stream of its own
// (SwimProtocol) is about seven yamux frames (open, data and close each
// way, and the protocol's echo), each a write and a wake-up of the other
// agent: with every agent probing once a second and probed as often, most
// of what woke an idle agent besides timers. On a kept stream it is one
// frame each way. Ping-reqs (which wait on a third node) and snapshots
// keep their own streams, and so does a ping to a node this one is not
// connected to (the connection is closed after it).

// SwimKeptProtocol carries pings on a kept stream: each frame is prefixed
// with its length (uvarint, at most swim.MaxFrame) and answered, in order,
// with an ack or, while the node has no room, busy.
const SwimKeptProtocol = "/tribe/swim-kept/1.0.0"

const (
	// swimKeptIdle is how long a node serving a kept stream waits for its
	// next ping before closing it. An agent probes a connected member at
	// random each second, so with 60 connections a given one every minute
	// or so: at 30 s, 100 agents on loopback opened a new kept stream for
	// most probes.
	swimKeptIdle = 5 * time.Minute
	// swimKeptReuse is how long the pinging node reuses a stream that has
	// been idle: well inside swimKeptIdle, so it does not meet the
	// serving end's close.
	swimKeptReuse = 2 * time.Minute
	// swimKeptPerPeer bounds the kept streams one peer holds open to this
	// node: one in use and one being replaced.
	swimKeptPerPeer = 2
	// swimKeptStrangers bounds the kept streams held open to this node by
	// all the peers that do not count, together: identities are free to
	// make, and each held two streams (two goroutines and their buffers)
	// for up to swimKeptIdle. Pending nodes probe the members they know
	// on such streams; past the bound they are answered on streams of
	// their own, swimStrangers at a time.
	swimKeptStrangers = 32
)

// keptSwim is a kept stream on the pinging side, with its reader. One
// exchange at a time uses it (busy, under the node's swim.mu); s is nil
// until that exchange opens it.
type keptSwim struct {
	s    network.Stream
	br   *bufio.Reader
	used time.Time
	busy bool
}

// appendKeptFrame appends f, prefixed with its length.
func appendKeptFrame(b []byte, f swim.Frame) []byte {
	body := swim.AppendFrame(nil, f)
	b = binary.AppendUvarint(b, uint64(len(body)))
	return append(b, body...)
}

// readKeptFrame reads one length-prefixed frame: at most swim.MaxFrame
// bytes (a length of at most three bytes), and no snapshot. A read error
// is returned as it is; bytes that break the protocol wrap swim.ErrFrame.
func readKeptFrame(br *bufio.Reader) (swim.Frame, error) {
	var size uint64
	for shift := uint(0); ; shift += 7 {
		c, err := br.ReadByte()
		if err != nil {
			return swim.Frame{}, err
		}
		size |= uint64(c&0x7f) << shift
		if c < 0x80 {
			break
		}
		if shift == 14 {
			return swim.Frame{}, fmt.Errorf("%w: a kept frame's length over three bytes", swim.ErrFrame)
		}
	}
	if size == 0 || size > swim.MaxFrame {
		return swim.Frame{}, fmt.Errorf("%w: a kept frame of %d bytes (1 to %d)", swim.ErrFrame, size, swim.MaxFrame)
	}
	// Grown as the bytes arrive: a length alone buys no memory.
	b, err := io.ReadAll(io.LimitReader(br, int64(size)))
	if err != nil {
		return swim.Frame{}, err
	}
	if len(b) < int(size) {
		return swim.Frame{}, io.ErrUnexpectedEOF
	}
	if swim.Kind(b[0]) == swim.KindSync {
		return swim.Frame{}, fmt.Errorf("%w: a snapshot on a kept stream", swim.ErrFrame)
	}
	return swim.DecodeFrame(b)
}

// swimKeptTo reports whether a ping to p goes on a kept stream: p is
// connected, not just for this exchange, and speaks the protocol.
func (n *Node) swimKeptTo(p peer.ID, reached bool) bool {
	if reached || !n.isConnected(p) {
		return false
	}
	ok, _ := n.host.Peerstore().SupportsProtocols(p, SwimKeptProtocol)
	return len(ok) > 0
}

// swimKeptExchange sends a ping to p on ks, the stream kept for it that
// the caller reserved (opening it if it is not open yet), and reads the
// answer. A kept stream that fails before answering may have been closed
// by the other end (idle, restarted): the ping is sent once more on a new
// stream.
func (n *Node) swimKeptExchange(ctx context.Context, p peer.ID, ks *keptSwim, f swim.Frame) (swim.Message, error) {
	for {
		fresh := ks.s == nil
		if fresh {
			s, err := n.host.NewStream(ctx, p, SwimKeptProtocol)
			if err != nil {
				n.dropKept(p)
				return swim.Message{}, err
			}
			ks.s, ks.br = s, bufio.NewReaderSize(s, 512)
		}
		ans, err := ks.exchange(ctx, f)
		if err == nil {
			n.releaseKept(ks)
			return n.swimAnswer(p, f, ans)
		}
		ks.s.Reset()
		ks.s = nil
		if errors.Is(err, swim.ErrFrame) {
			n.dropKept(p)
			n.swim.bad.Add(1)
			n.log.Debug("swim: bad answer on a kept stream", "peer", p, "err", err)
			return swim.Message{}, err
		}
		if fresh || ctx.Err() != nil {
			n.dropKept(p)
			return swim.Message{}, err
		}
	}
}

// exchange writes f and reads the answer, within ctx's deadline.
func (ks *keptSwim) exchange(ctx context.Context, f swim.Frame) (swim.Frame, error) {
	if dl, ok := ctx.Deadline(); ok {
		ks.s.SetDeadline(dl)
	}
	if _, err := ks.s.Write(appendKeptFrame(nil, f)); err != nil {
		return swim.Frame{}, err
	}
	ans, err := readKeptFrame(ks.br)
	if err != nil {
		return swim.Frame{}, err
	}
	ks.s.SetDeadline(time.Time{})
	return ans, nil
}

// takeKept reserves p's kept stream for one exchange; ok is false if
// another exchange holds it (the caller then uses a stream of its own). A
// stream idle for swimKeptReuse is closed, and the reservation holds none.
func (n *Node) takeKept(p peer.ID) (ks *keptSwim, ok bool) {
	var stale network.Stream
	defer func() {
		if stale != nil {
			stale.Close() // outside the lock: it writes
		}
	}()
	n.swim.mu.Lock()
	defer n.swim.mu.Unlock()
	ks = n.swim.kept[p]
	switch {
	case ks == nil:
		ks = &keptSwim{}
		n.swim.kept[p] = ks
	case ks.busy:
		return nil, false
	case ks.s != nil && time.Since(ks.used) >= swimKeptReuse:
		stale, ks.s = ks.s, nil
	}
	ks.busy = true
	return ks, true
}

// releaseKept ends an exchange's hold on ks, which stays for the next.
func (n *Node) releaseKept(ks *keptSwim) {
	n.swim.mu.Lock()
	ks.used, ks.busy = time.Now(), false
	n.swim.mu.Unlock()
}

// dropKept forgets p's kept stream (closed by the caller, or never open).
func (n *Node) dropKept(p peer.ID) {
	n.swim.mu.Lock()
	delete(n.swim.kept, p)
	n.swim.mu.Unlock()
}

// serveSwimKept answers the pings that come on a kept stream, in order,
// until the stream has been idle for swimKeptIdle or breaks the protocol
// (counted as a bad frame). A ping that finds all swimServing slots taken
// is answered busy (alive, nothing taken), as on a stream of its own.
func (n *Node) serveSwimKept(s network.Stream) {
	p := s.Conn().RemotePeer()
	stranger := !n.rules().Counts(p) // as taken, so given back
	if !n.keptServe(p, 1, stranger) {
		n.swim.busy.Add(1)
		s.Reset()
		return
	}
	// The slot is given back before the stream ends: a peer that sees
	// the end (a reset for a bad frame) may open the next stream at once.
	if n.serveKeptFrames(s, p) {
		n.keptServe(p, -1, stranger)
		s.Close()
		return
	}
	n.keptServe(p, -1, stranger)
	s.Reset()
}

// serveKeptFrames is serveSwimKept's loop: it reports whether the stream
// ended well (the peer closed it), else it must be reset.
func (n *Node) serveKeptFrames(s network.Stream, p peer.ID) bool {
	br := bufio.NewReaderSize(s, 512)
	var out []byte
	for {
		s.SetReadDeadline(time.Now().Add(swimKeptIdle))
		f, err := readKeptFrame(br)
		if err == nil && f.Kind != swim.KindPing {
			err = fmt.Errorf("%w: kind %d on a kept stream", swim.ErrFrame, f.Kind)
		}
		switch {
		case errors.Is(err, io.EOF):
			return true
		case errors.Is(err, swim.ErrFrame):
			n.swim.bad.Add(1)
			n.log.Debug("swim: bad frame on a kept stream", "peer", p, "err", err)
			return false
		case err != nil: // idle too long, reset, connection gone
			return false
		}
		ans := swim.Frame{Kind: swim.KindBusy}
		select {
		case n.swim.serving <- struct{}{}:
			ans = swim.Frame{Kind: swim.KindAck}
			if n.rules().Counts(p) { // a stranger gets a plain ack (serveSwim)
				n.swimHeard(p)
				ans.Msg = n.swim.d.HandlePing(string(p), f.Msg)
			} else {
				n.swim.d.Receive(f.Msg)
			}
			<-n.swim.serving
		default:
			n.swim.busy.Add(1)
		}
		s.SetWriteDeadline(time.Now().Add(n.cfg.ProbeInterval))
		out = appendKeptFrame(out[:0], ans)
		if _, err := s.Write(out); err != nil {
			return false
		}
	}
}

// keptServe counts p's kept streams served here by delta, and those of
// all strangers (peers that do not count) together; taking one past
// swimKeptPerPeer, or a stranger's past swimKeptStrangers, is refused
// (false).
func (n *Node) keptServe(p peer.ID, delta int, stranger bool) bool {
	n.swim.mu.Lock()
	defer n.swim.mu.Unlock()
	k := n.swim.keptServed[p] + delta
	if k > swimKeptPerPeer || stranger && delta > 0 && n.swim.keptStrangers >= swimKeptStrangers {
		return false
	}
	if stranger {
		n.swim.keptStrangers += delta
	}
	if k <= 0 {
		delete(n.swim.keptServed, p)
	} else {
		n.swim.keptServed[p] = k
	}
	return true
}
