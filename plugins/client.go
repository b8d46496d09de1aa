package plugins

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/tribeagent/tribe/internal/backoff"
)

// Call makes one call to p on a stream of its own, closed after it, and
// returns its answer. Every way a call can fail comes back as a Response
// with a Code; Call never waits past ctx, and gives p up as gone when it
// stays silent for Silence. A Caller keeps streams for the next call.
func Call(ctx context.Context, h host.Host, p peer.ID, req Request) Response {
	return (&Caller{host: h, kept: newKeptSet(0, 0), dials: newDialWindow()}).Call(ctx, p, req)
}

// A Caller makes calls, keeping each stream open after its call (at most
// keptPerPeer per callee and max in all, each for KeptIdle) so that the
// next call to that callee skips opening one: a call on a stream of its
// own took 2.2–2.6x as long (BenchmarkCallVsRawStream in node).
type Caller struct {
	host   host.Host
	mu     sync.Mutex
	kept   *keptSet    // empty of room (max 0) for a Caller that keeps nothing
	sweep  *time.Timer // closes kept streams past keptIdle; armed while any is kept
	closed bool
	dials  *dialWindow // bounds the dials in flight
}

// NewCaller makes a caller that keeps at most max streams open between
// calls.
func NewCaller(h host.Host, max int) *Caller {
	return &Caller{host: h, kept: newKeptSet(max, keptPerPeer), dials: newDialWindow()}
}

// keptPerPeer bounds the streams a Caller keeps to one callee: a fan-out
// calls each callee once; more at once open more and close them after.
const keptPerPeer = 2

// keptIdle is KeptIdle; tests shorten it.
var keptIdle = KeptIdle

// Drop closes the streams kept to p (its connection is being closed).
func (c *Caller) Drop(p peer.ID) {
	c.mu.Lock()
	gone := c.kept.drop(p)
	c.mu.Unlock()
	closeAll(gone)
}

// Close closes every kept stream.
func (c *Caller) Close() error {
	c.mu.Lock()
	c.closed = true
	gone := c.kept.dropAll()
	if c.sweep != nil {
		c.sweep.Stop()
	}
	c.mu.Unlock()
	closeAll(gone)
	return nil
}

func closeAll(sts []*callStream) {
	for _, cs := range sts {
		cs.st.Close()
	}
}

// callStream is a stream of ProtocolID and its reader.
type callStream struct {
	st   network.Stream
	br   *bufio.Reader
	peer peer.ID
	used time.Time // when its last call ended
}

// take is a kept stream to p, if there is one.
func (c *Caller) take(p peer.ID) *callStream {
	c.mu.Lock()
	cs, expired := c.kept.take(p, time.Now(), keptIdle)
	c.mu.Unlock()
	closeAll(expired)
	return cs
}

// keep keeps cs for the next call to its callee, or closes it.
func (c *Caller) keep(cs *callStream) {
	cs.used = time.Now()
	c.mu.Lock()
	kept, expired := false, []*callStream(nil)
	if !c.closed {
		kept, expired = c.kept.put(cs, cs.used, keptIdle)
	}
	if kept && c.sweep == nil {
		c.sweep = time.AfterFunc(keptIdle, c.sweepKept)
	}
	c.mu.Unlock()
	closeAll(expired)
	if !kept {
		cs.st.Close()
	}
}

// sweepKept closes the kept streams idle for keptIdle, and comes back
// while any is kept: a stream to a node not called again is closed
// here, not left for the callee to close.
func (c *Caller) sweepKept() {
	c.mu.Lock()
	expired := c.kept.expire(time.Now(), keptIdle)
	if c.kept.n > 0 && !c.closed {
		c.sweep.Reset(keptIdle)
	} else {
		c.sweep = nil
	}
	c.mu.Unlock()
	closeAll(expired)
}

// Call makes one call to p: on a kept stream if there is one, else on a
// new one (see the package function Call).
func (c *Caller) Call(ctx context.Context, p peer.ID, req Request) Response {
	if dl, ok := ctx.Deadline(); ok {
		req.Deadline = max(1, time.Until(dl).Milliseconds())
	}
	b, err := json.Marshal(req)
	if err != nil {
		return Response{ID: req.ID, Code: CodeBadRequest, Error: "arguments: " + err.Error()}
	}
	if len(b) > MaxRequestSize {
		return Response{ID: req.ID, Code: CodeTooLarge, Error: "the request is " + byteSize(len(b)) + ", over the " + byteSize(MaxRequestSize) + " limit"}
	}
	if cs := c.take(p); cs != nil {
		resp, fresh := c.callOn(ctx, cs, req, b, true)
		if !fresh {
			return resp
		}
		// The callee had closed the stream, unread: a new one.
	}
	st, err := c.newStream(ctx, p, ProtocolID)
	if err != nil {
		return openFailure(ctx, req.ID, err)
	}
	resp, _ := c.callOn(ctx, &callStream{st: st, br: bufio.NewReader(st), peer: p}, req, b, false)
	return resp
}

// newStream opens a stream of proto (a call's or an order's) to p. A dial
// (no connection to p yet) waits for room in the caller's dial window, and
// reports back whether it timed out.
func (c *Caller) newStream(ctx context.Context, p peer.ID, proto protocol.ID) (network.Stream, error) {
	if c.host.Network().Connectedness(p) == network.Connected {
		return c.host.NewStream(ctx, p, proto)
	}
	if err := c.dials.acquire(ctx); err != nil {
		return nil, err
	}
	st, err := c.host.NewStream(ctx, p, proto)
	c.dials.release(err != nil && ctx.Err() == nil && dialTimedOut(err))
	return st, err
}

// openFailure is the response for a call (or an order) whose stream did
// not open.
func openFailure(ctx context.Context, id string, err error) Response {
	if r, ok := ctxFailure(ctx, id); ok {
		return r
	}
	if errors.Is(err, network.ErrResourceLimitExceeded) {
		// Ours or the callee's: the error names the scope and the
		// resource (README, "Connection and stream limits").
		return Response{ID: id, Code: CodeBusy, Error: "a connection or stream limit is reached, try again or call fewer nodes at once: " + err.Error()}
	}
	// A dial that timed out (a connect or handshake not done by the
	// swarm's deadline, 15 s: the callee or this node too busy
	// to finish it), or whose connection closed before a stream opened
	// on it, may be made again: FanOut does, while the call's context
	// lasts. Nothing was sent.
	return Response{ID: id, Code: CodeUnreachable, Error: "cannot reach the node: " + err.Error(),
		again: dialTimedOut(err) || connLostBeforeStream(err)}
}

// connLostBeforeStream reports a connection that was made but closed
// before a stream opened on it (libp2p's basic host says only "connection
// failed", basic_host.go, when the swarm has no connection left to open
// the stream on): seen on a melted 200-agent fleet, where the callee's
// connection manager or limits close connections as they come.
//
// A connection closed while the stream's protocol was negotiated sent
// nothing either: a network.ConnError ("failed to negotiate protocol:
// connection closed (local)", seen on the same fleet when this node
// closed a connection another exchange had opened), a connection that
// was gone when the stream was opened on it (QUIC's stateless reset or
// idle timeout, seen there too, and the like: net.ErrClosed), or a TCP
// connection the other end reset or closed under it ("write: connection
// reset by peer", seen there as well).
func connLostBeforeStream(err error) bool {
	var closed *network.ConnError
	return err != nil && (err.Error() == "connection failed" || errors.As(err, &closed) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE))
}

// dialTimedOut reports a dial error from a deadline inside the dial (an
// address's connect or handshake timed out), as opposed to a refusal, an
// unreachable network, a peer ID that does not match, or a limit.
func dialTimedOut(err error) bool {
	if errors.Is(err, network.ErrResourceLimitExceeded) {
		return false
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)
}

// callOn makes the call req (encoded as b) on cs, then keeps cs or
// closes it. On a kept stream (reused) that the callee closed before
// reading the call (it left it idle too long, or is stopping), or that
// broke before the call was sent, it returns fresh: the call was not
// made and may be made on a new stream.
func (c *Caller) callOn(ctx context.Context, cs *callStream, req Request, b []byte, reused bool) (resp Response, fresh bool) {
	st := cs.st
	stop := context.AfterFunc(ctx, func() { st.Reset() })
	defer stop()
	if err := writeFrame(st, b); err != nil {
		st.Reset()
		if r, ok := ctxFailure(ctx, req.ID); ok {
			return r, false
		}
		if reused {
			return Response{}, true
		}
		return Response{ID: req.ID, Code: CodeGone, Error: "sending the request: " + err.Error()}, false
	}
	heard := false
	for {
		st.SetReadDeadline(time.Now().Add(silence))
		f, held, err := readFrame(cs.br, MaxResponseSize, st.Scope())
		if err != nil {
			st.Reset()
			if r, ok := ctxFailure(ctx, req.ID); ok {
				return r, false
			}
			switch {
			case reused && !heard && err == io.EOF:
				// A callee closes a stream (cleanly: a reset is not
				// io.EOF) only between calls: this one never read
				// the request.
				return Response{}, true
			case isTimeout(err):
				return Response{ID: req.ID, Code: CodeGone, Error: fmt.Sprintf("no word from the node for %v: it crashed or lost its connection", silence)}, false
			case errors.Is(err, ErrFrameTooLarge):
				return Response{ID: req.ID, Code: CodeTooLarge, Error: "response: " + err.Error()}, false
			case errors.Is(err, ErrFrameNoMemory):
				return Response{ID: req.ID, Code: CodeBusy, Error: "response: " + err.Error()}, false
			}
			return Response{ID: req.ID, Code: CodeGone, Error: "the node went away mid-call: " + err.Error()}, false
		}
		heard = true
		if len(f) == 0 {
			continue // heartbeat
		}
		resp, err := DecodeResponse(f)
		st.Scope().ReleaseMemory(held) // the response holds copies
		if err == nil && resp.ID != req.ID && resp.ID != "" {
			err = fmt.Errorf("plugins: response to call %q, not %q", resp.ID, req.ID)
		}
		if err != nil {
			st.Reset()
			return Response{ID: req.ID, Code: CodeBadResponse, Error: err.Error()}, false
		}
		resp.ID = req.ID
		st.SetReadDeadline(time.Time{})
		// The callee keeps the stream by the same rule (server.go). Not
		// stopped, the context's end has reset it.
		if stopped := stop(); stopped && carries(resp) && len(b) <= KeptFrame && len(f) <= KeptFrame {
			c.keep(cs)
		} else if stopped {
			st.Close()
		}
		return resp, false
	}
}

// isTimeout reports a read deadline passing (yamux and QUIC streams have
// their own error types for it; both say Timeout).
func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &t) && t.Timeout())
}

// ctxFailure is the response for a call whose context ended.
func ctxFailure(ctx context.Context, id string) (Response, bool) {
	switch {
	case ctx.Err() == nil:
		return Response{}, false
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return Response{ID: id, Code: CodeTimeout, Error: "no answer before the deadline"}, true
	}
	return Response{ID: id, Code: CodeCanceled, Error: "canceled"}, true
}

// FanOut runs call for every target, at most parallel at once, and hands
// each answer to out as soon as it arrives. out is called from one
// goroutine at a time; FanOut returns after the last answer, so call must
// itself respect ctx (Call does).
//
// A call whose dial timed out (a callee, or this node, too busy to finish
// a handshake by the dial's deadline, which says nothing of the call's),
// or an order whose answer was lost on the way (Caller.Order), is made
// again after a pause, dialRetryFirst doubling to dialRetryMax (±20%),
// for as long as ctx lasts, dialling directly (past the swarm's backoff,
// which the failure set). The pause holds no slot: the targets behind it
// go first. FanOut returns how many calls it made again.
func FanOut[T any](ctx context.Context, targets []T, parallel int, call func(context.Context, T) Response, out func(T, Response)) (again int) {
	if parallel < 1 {
		parallel = 1
	}
	sem := make(chan struct{}, parallel)
	var (
		wg     sync.WaitGroup
		omu    sync.Mutex
		agains atomic.Int64
	)
	again1 := network.WithForceDirectDial(ctx, "a call's dial that timed out, made again")
	for _, t := range targets {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			resp := call(ctx, t)
			<-sem
			for try := 1; resp.again && pause(ctx, backoff.Wait(try, dialRetryFirst, dialRetryMax, rand.Float64())) && retake(ctx, sem); try++ {
				agains.Add(1)
				resp = call(again1, t)
				<-sem
			}
			omu.Lock()
			defer omu.Unlock()
			out(t, resp)
		}()
	}
	wg.Wait()
	return int(agains.Load())
}

// retake takes a slot of sem for a call made again, and reports whether
// it did before ctx ended. A slot taken just as ctx ends (select picks
// either when both are ready) is given back: kept, every slot could leak
// while targets remain, and FanOut would wait for one for good.
func retake(ctx context.Context, sem chan struct{}) bool {
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	if ctx.Err() != nil {
		<-sem
		return false
	}
	return true
}

// pause waits d, and reports whether ctx still lasts after it.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// The pauses before a call whose dial timed out is made again
// (backoff.Wait): dialRetryFirst, doubling up to dialRetryMax, each ±20%.
// Variables for tests.
var (
	dialRetryFirst = 500 * time.Millisecond
	dialRetryMax   = 5 * time.Second
)

func byteSize(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}
