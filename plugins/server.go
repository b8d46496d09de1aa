package plugins

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"

	"github.com/tribeagent/tribe/internal/slots"
)

// Authorizer decides who may call what. The node implements it over the
// replicated state: the plugin must be loaded here in a tribe both sides
// belong to, or the caller must be a trusted writer. Authorize is called
// for every request from many goroutines and must not block on the network.
// It returns the instance to run, or an *Error (unauthorized, not_loaded).
type Authorizer interface {
	Authorize(caller peer.ID, req Request) (*Instance, error)
}

// readTimeout bounds how long a callee waits for a stream's first
// request, and writeTimeout how long it tries to deliver a response.
// Variables for tests.
var (
	readTimeout  = 10 * time.Second
	writeTimeout = 10 * time.Second
)

// streamIdle is how long a callee keeps a stream open with no call
// running and none sent: a caller keeps a stream for keptIdle, less, so
// it never sends a call on a stream the callee is closing (tests shorten
// both).
var streamIdle = StreamIdle

// watchAfter is how long a call runs before the callee starts watching
// for the caller's reset and sending heartbeats.
const watchAfter = 20 * time.Millisecond

// Flood limits. A callee has at most MaxCallsPerCaller calls from one
// caller in flight at once, across plugins and tribes, waiting in a
// plugin's queue included, and refuses more as busy (counted in Refused),
// so one caller cannot take every plugin's queue from the others.
//
// For that refusal to be made here, and counted, libp2p must let the
// streams through instead of resetting them first (its default allows 64
// inbound streams of one protocol per peer, fewer than one plugin's
// concurrency and queue). A host that serves calls allows
// CallStreamsPerPeer streams of ProtocolID per peer each way: that many
// calls at once from one caller, refused ones included, reach the server.
// (One `tribe call` sends one call per node; only many at once from one
// host come near it.) The node's host sets it in its limits table;
// AddLimits sets it in a libp2p.New host's.
const (
	MaxCallsPerCaller  = 64
	CallStreamsPerPeer = 4 * MaxCallsPerCaller
)

// A caller that does not count (WithCounts: a node no trusted writer
// admitted) is refused every call, so it needs few streams; yet each one
// it opens may wait readTimeout for its request. It gets at most
// StrangerCallStreams at once, and all such callers together
// strangerStreamsAll, checked when the stream opens: eight strangers with
// CallStreamsPerPeer each used to hold every inbound stream the system
// allows, members' probes and calls included. Its streams of
// RelayProtocol (a Relay on this Server) count among them.
const StrangerCallStreams = 4

// strangerStreamsAll is a variable for tests.
var strangerStreamsAll = 128

// AddLimits sets the call protocol's per-peer stream limits in cfg, the
// resource manager's scaling configuration of a host built otherwise
// (libp2p.New's is rcmgr.DefaultLimits).
func AddLimits(cfg *rcmgr.ScalingLimitConfig) {
	cfg.AddProtocolPeerLimit(ProtocolID, rcmgr.BaseLimit{
		StreamsInbound:  CallStreamsPerPeer,
		StreamsOutbound: CallStreamsPerPeer,
		Streams:         2 * CallStreamsPerPeer,
		Memory:          cfg.ProtocolPeerBaseLimit.Memory,
	}, rcmgr.BaseLimitIncrease{})
}

// Server is the callee side of the call protocol (ProtocolID).
type Server struct {
	host host.Host
	auth Authorizer
	log  *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	refused   map[Code]int64
	inFlight  map[peer.ID]int // remote calls by caller
	idle      map[peer.ID]int // streams waiting for a caller's next call
	strangers *slots.Slots    // open streams of callers that do not count

	served ServedFunc         // nil: nobody is told
	counts func(peer.ID) bool // nil: every caller counts
}

// ServedFunc is told of every call a Server ran a plugin for: the plugin's
// name, the outcome's code (empty for an answer that is ok) and how long
// it ran. Calls refused before that (Refused counts them) are not
// reported, so plugin is always one that is loaded here, never a name a
// caller made up. It runs on the call's goroutine, once per call: it must
// be safe for concurrent use and must not block.
type ServedFunc func(plugin string, code Code, d time.Duration)

// ServerOption is an optional setting of NewServer.
type ServerOption func(*Server)

// WithServed reports every call the server ran to f (see ServedFunc).
func WithServed(f ServedFunc) ServerOption { return func(s *Server) { s.served = f } }

// WithCounts says which callers count (trusted or admitted): the others
// get few streams (StrangerCallStreams). f is called as each stream opens,
// from many goroutines; it must be safe for concurrent use and must not
// block.
func WithCounts(f func(peer.ID) bool) ServerOption { return func(s *Server) { s.counts = f } }

// NewServer makes a server; Start registers it on the host.
func NewServer(h host.Host, auth Authorizer, log *slog.Logger, opts ...ServerOption) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{host: h, auth: auth, log: log, ctx: ctx, cancel: cancel,
		refused: map[Code]int64{}, inFlight: map[peer.ID]int{}, idle: map[peer.ID]int{},
		strangers: slots.New(strangerStreamsAll, StrangerCallStreams)}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Start handles the protocol on the host.
func (s *Server) Start() { s.host.SetStreamHandler(ProtocolID, s.handle) }

// Close stops taking calls, cancels those running and waits for them.
func (s *Server) Close() error {
	s.host.RemoveStreamHandler(ProtocolID)
	s.cancel()
	s.wg.Wait()
	return nil
}

// Refused counts refused and malformed requests by code.
func (s *Server) Refused() map[Code]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.refused)
}

func (s *Server) count(code Code) {
	s.mu.Lock()
	s.refused[code]++
	s.mu.Unlock()
}

// enter takes one of caller's MaxCallsPerCaller slots; leave gives it
// back.
func (s *Server) enter(caller peer.ID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight[caller] >= MaxCallsPerCaller {
		return false
	}
	s.inFlight[caller]++
	return true
}

func (s *Server) leave(caller peer.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight[caller]--; s.inFlight[caller] <= 0 {
		delete(s.inFlight, caller)
	}
}

// InFlight is how many of caller's calls run or wait here now.
func (s *Server) InFlight(caller peer.ID) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight[caller]
}

// admitStream takes a stream slot for caller if it does not count, and
// reports whether it may go on and whether it took a slot (to give back
// with leaveStream).
func (s *Server) admitStream(caller peer.ID) (ok, stranger bool) {
	if s.counts == nil || s.counts(caller) {
		return true, false
	}
	return s.strangers.Acquire(caller), true
}

func (s *Server) leaveStream(caller peer.ID) { s.strangers.Release(caller) }

// Serve runs req for caller. The node calls it directly for calls to
// itself, so they follow the same rules as remote ones.
func (s *Server) Serve(ctx context.Context, caller peer.ID, req Request) Response {
	start := time.Now()
	inst, err := s.auth.Authorize(caller, req)
	if err != nil {
		resp := failure(req.ID, err)
		s.count(resp.Code)
		s.log.Debug("call refused", "caller", caller, "plugin", req.Plugin, "tribe", req.Tribe, "code", resp.Code, "err", err)
		return resp
	}
	result, err := inst.Invoke(ctx, req.Method, req.Args)
	resp := Response{ID: req.ID, OK: err == nil, Result: result, Duration: time.Since(start)}
	if s.served != nil {
		defer func() { s.served(req.Plugin, resp.Code, resp.Duration) }()
	}
	if err == nil {
		return resp
	}
	switch {
	case ctx.Err() != nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded):
		resp.Code, resp.Error = CodeTimeout, "timed out after "+req.Timeout().String()+" on the node"
	case ctx.Err() != nil:
		resp.Code, resp.Error = CodeCanceled, "canceled: the caller went away"
	default:
		f := failure(req.ID, err)
		resp.Code, resp.Error = f.Code, f.Error
		if f.Code == CodeBusy || f.Code == CodeUnknownMethod {
			s.count(f.Code)
		}
	}
	return resp
}

// handle serves one stream: calls one after another, each a request,
// heartbeats while it runs, and its response; until the caller closes the
// stream, breaks the protocol, is refused, or leaves the stream idle for
// streamIdle.
func (s *Server) handle(st network.Stream) {
	s.wg.Add(1)
	defer s.wg.Done()
	caller := st.Conn().RemotePeer()
	ok, stranger := s.admitStream(caller)
	if !ok {
		// Its calls would be refused anyway: unread, and counted as such.
		s.count(CodeUnauthorized)
		s.log.Debug("call stream refused: too many from callers that do not count", "caller", caller)
		st.Reset()
		return
	}
	if stranger {
		defer s.leaveStream(caller)
	}
	// Closing the server ends the wait for a stream's next call.
	stop := context.AfterFunc(s.ctx, func() { st.SetReadDeadline(time.Now()) })
	defer stop()
	br := bufio.NewReader(st)
	for first := true; ; first = false {
		if !first && !s.awaitNext(st, br, caller) {
			st.Close()
			return
		}
		st.SetReadDeadline(time.Now().Add(readTimeout))
		if s.ctx.Err() != nil {
			st.Close()
			return
		}
		b, held, err := readFrame(br, MaxRequestSize, st.Scope())
		var req Request
		if err == nil {
			req, err = DecodeRequest(b)
			st.Scope().ReleaseMemory(held) // the request holds copies
		}
		if err != nil {
			if s.ctx.Err() != nil { // the server is closing: not the caller's doing
				st.Close()
				return
			}
			code := CodeBadRequest
			switch {
			case errors.Is(err, ErrFrameTooLarge):
				code = CodeTooLarge
			case errors.Is(err, ErrFrameNoMemory):
				code = CodeBusy
			case isTimeout(err):
				// Not a malformed request: one that did not come whole
				// in time (a caller, or this node, starved of CPU; or a
				// slow sender). Counted, and nothing to answer.
				s.count(CodeTimeout)
				s.log.Debug("a call request did not come in time; stream reset", "caller", caller, "err", err)
				st.Reset()
				return
			}
			s.count(code)
			s.log.Debug("bad call request", "caller", caller, "err", err)
			s.reply(st, Response{Code: code, Error: err.Error()})
			st.Close() // what follows a bad frame cannot be read
			return
		}
		st.SetReadDeadline(time.Time{})
		resp, ok := s.serveOnStream(st, br, caller, req)
		if !ok {
			return
		}
		if !carries(resp.Response) || len(b) > KeptFrame || resp.size > KeptFrame {
			st.Close()
			return
		}
	}
}

// maxIdlePerCaller bounds the streams one caller may keep open on this
// node between calls (a Caller keeps at most keptPerPeer).
const maxIdlePerCaller = 2 * keptPerPeer

// awaitNext waits up to streamIdle for the first byte of caller's next
// call on st, and reports whether it came. A caller already keeping
// maxIdlePerCaller streams idle here gets no more: st is not waited on.
func (s *Server) awaitNext(st network.Stream, br *bufio.Reader, caller peer.ID) bool {
	s.mu.Lock()
	if s.idle[caller] >= maxIdlePerCaller {
		s.mu.Unlock()
		return false
	}
	s.idle[caller]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.idle[caller]--; s.idle[caller] <= 0 {
			delete(s.idle, caller)
		}
		s.mu.Unlock()
	}()
	st.SetReadDeadline(time.Now().Add(streamIdle))
	if s.ctx.Err() != nil {
		return false
	}
	_, err := br.Peek(1) // then the frame has readTimeout, as a first one
	return err == nil
}

// serveOnStream runs one call that came on st and answers it there. It
// returns the answer (its size in size) and whether it could be written.
func (s *Server) serveOnStream(st network.Stream, br *bufio.Reader, caller peer.ID, req Request) (sized, bool) {
	if !s.enter(caller) {
		s.count(CodeBusy)
		s.log.Debug("call refused: too many from this caller", "caller", caller, "plugin", req.Plugin)
		return s.reply(st, Response{ID: req.ID, Code: CodeBusy,
			Error: fmt.Sprintf("busy: %d calls from you are already running or waiting here", MaxCallsPerCaller)})
	}
	defer s.leave(caller)

	ctx, cancel := context.WithTimeout(s.ctx, req.Timeout())
	defer cancel()
	// Calls that end quickly (most) need no helpers; one still running
	// after watchAfter gets a watcher that cancels it when the caller goes
	// away (a caller waits for the answer before it sends anything more,
	// so anything but silence or a clean end of its side means it reset
	// the stream or broke the protocol) and heartbeats that tell the
	// caller this node is still at it.
	var wmu sync.Mutex
	finished, broken, wrote := false, false, false
	watching := make(chan struct{})
	watch := time.AfterFunc(watchAfter, func() {
		go func() {
			defer close(watching)
			// Peek leaves a byte that came for the stream's next reader.
			if _, err := br.Peek(1); (err == nil || !errors.Is(err, io.EOF)) && !isTimeout(err) {
				wmu.Lock()
				broken, wrote = !finished, err == nil && !finished
				wmu.Unlock()
				cancel()
			}
		}()
		go func() {
			t := time.NewTicker(heartbeat)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				wmu.Lock()
				if finished {
					wmu.Unlock()
					return
				}
				st.SetWriteDeadline(time.Now().Add(writeTimeout))
				err := writeFrame(st, nil)
				wmu.Unlock()
				if err != nil {
					cancel()
					return
				}
			}
		}()
	})
	resp := s.Serve(ctx, caller, req)
	if !watch.Stop() {
		// The watcher runs: end its wait, so that the stream's next
		// reader is the only one.
		st.SetReadDeadline(time.Now())
		<-watching
	}
	wmu.Lock()
	defer wmu.Unlock()
	finished = true
	if broken {
		if wrote { // not a reset: the caller broke the protocol
			s.count(CodeBadRequest)
			s.log.Debug("a caller wrote during its call; stream reset", "caller", caller)
		}
		st.Reset()
		return sized{}, false
	}
	return s.reply(st, resp)
}

// sized is a response written, with the size of its frame.
type sized struct {
	Response
	size int
}

// reply writes resp on st, and reports whether it could.
func (s *Server) reply(st network.Stream, resp Response) (sized, bool) {
	b, err := json.Marshal(resp)
	if err == nil && len(b) > MaxResponseSize {
		resp = Response{ID: resp.ID, Code: CodeTooLarge, Duration: resp.Duration,
			Error: "the result is " + byteSize(len(resp.Result)) + ", over the " + byteSize(MaxResponseSize) + " a response may carry"}
		b, err = json.Marshal(resp)
	}
	if err != nil {
		// Only a result that is not JSON fails to encode.
		s.log.Warn("a plugin returned a result that is not JSON", "err", err)
		b, _ = json.Marshal(Response{ID: resp.ID, Code: CodeFailed, Duration: resp.Duration,
			Error: "the plugin returned a result that is not JSON: " + err.Error()})
	}
	st.SetWriteDeadline(time.Now().Add(writeTimeout))
	if err := writeFrame(st, b); err != nil {
		st.Reset()
		return sized{}, false
	}
	return sized{resp, len(b)}, true
}
