package plugins

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/internal/slots"
)

// RelayDeps are what a Relay needs.
type RelayDeps struct {
	Host   host.Host
	Server *Server        // runs the orders meant for this node
	Key    crypto.PrivKey // this node's: signs its answers
	Log    *slog.Logger   // nil: nothing logged
	// Counts says whose orders this node relays (trusted or admitted
	// callers; nil: everyone's). Called from many goroutines: it must be
	// safe for concurrent use and must not block.
	Counts func(peer.ID) bool
	// Reach makes a target dialable before the relay opens a stream to it
	// (the node adds its recorded addresses). Nil: nothing to do. Same
	// rules as Counts.
	Reach func(peer.ID)
	// Use registers an exchange with a target, and done ends it: the
	// node closes a connection opened for it after it, as after its own
	// calls. Nil: nothing to do. Same rules as Counts.
	Use func(peer.ID) (done func())
}

// Relay is both ends of RelayProtocol on a node: it runs the orders meant
// for this node, and passes orders on to the other targets they name.
type Relay struct {
	d      RelayDeps
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	ran   map[string]*taken // orders taken ("caller/id"; "r/" and the envelope's hash for relaying)
	takes map[peer.ID]int   // entries of ran by caller
	kept  int               // bytes of the answers ran holds
	// earliest is no later than the earliest deadline in ran: forget
	// walks ran only once one may have passed, not at every order taken
	// or answer kept while the table or the budget is full.
	earliest int64
	// runs counts the orders run here, answersAgain those answered
	// again with the answer kept.
	runs, answersAgain atomic.Int64
	// relaying bounds the orders relayed at once, in all and per caller.
	relaying *slots.Slots
}

// Bounds of a relay: the orders it passes on at once, in all and per
// caller; the calls each of them makes at once; the orders it remembers
// (each until its deadline, at most MaxTimeout away), in all and per
// caller, past which it refuses new ones as busy.
const (
	relayOrders            = 32
	relayOrdersPerPeer     = 4
	relayParallel          = 32
	maxRemembered          = 1 << 16
	maxRememberedPerCaller = 1 << 12
	// An order's answer is kept (until the order's deadline) if it is
	// at most maxKeptAnswer bytes, up to maxKeptAnswers in all: an order
	// sent again after its answer was lost on the way gets it again. A
	// larger one, or past the budget, is refused as taken before.
	maxKeptAnswer  = 16 << 10
	maxKeptAnswers = 16 << 20
)

// NewRelay makes a relay; Start registers it on the host.
func NewRelay(d RelayDeps) *Relay {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Relay{d: d, ctx: ctx, cancel: cancel, ran: map[string]*taken{}, takes: map[peer.ID]int{},
		relaying: slots.New(relayOrders, relayOrdersPerPeer)}
}

// Ran is how many orders this node ran (took, and handed to its server).
func (r *Relay) Ran() int64 { return r.runs.Load() }

// AnsweredAgain is how many orders that came again this node answered
// with the answer it kept.
func (r *Relay) AnsweredAgain() int64 { return r.answersAgain.Load() }

// Start serves RelayProtocol.
func (r *Relay) Start() { r.d.Host.SetStreamHandler(RelayProtocol, r.handle) }

// Close stops serving and ends the orders in flight.
func (r *Relay) Close() error {
	r.d.Host.RemoveStreamHandler(RelayProtocol)
	r.cancel()
	r.wg.Wait()
	return nil
}

// handle serves one stream: one order, in either mode.
func (r *Relay) handle(st network.Stream) {
	r.wg.Add(1)
	defer r.wg.Done()
	from := st.Conn().RemotePeer()
	// Orders come from callers and relays, which count: a peer that
	// does not shares its few call streams (StrangerCallStreams) with
	// these, before any byte is read.
	ok, stranger := r.d.Server.admitStream(from)
	if !ok {
		r.refuse(st, from, CodeUnauthorized, errors.New("plugins: too many call and relay streams from nodes that do not count"))
		return
	}
	if stranger {
		defer r.d.Server.leaveStream(from)
	}
	st.SetReadDeadline(time.Now().Add(readTimeout))
	b, held, err := readFrame(bufio.NewReader(st), maxOrderSize, st.Scope())
	if err != nil {
		r.refuse(st, from, codeOfFrameError(err), err)
		return
	}
	mode, body, err := splitFrame(b)
	st.Scope().ReleaseMemory(held)
	var (
		o      *Order
		caller peer.ID
	)
	if err == nil {
		o, caller, err = OpenOrder(body)
	}
	if err != nil {
		r.refuse(st, from, CodeBadRequest, err)
		return
	}
	st.SetReadDeadline(time.Time{})
	switch mode {
	case ModeServe:
		r.serve(st, o, caller)
	case ModeRelay, ModeNear:
		if from != caller {
			// Only the caller hands its orders to relays (a relay passes
			// them on in ModeServe): anyone else who holds one, a relay
			// or a target, would have every node it reaches pass it on
			// to all its targets again, in the caller's relay slots.
			r.refuse(st, from, CodeUnauthorized, fmt.Errorf("plugins: an order of %s's handed over by %s: a node relays an order only for its signer", caller, from))
			return
		}
		r.relay(st, o, caller, body, mode == ModeRelay)
	default:
		r.refuse(st, from, CodeBadRequest, fmt.Errorf("plugins: relay mode %q", mode))
	}
}

// codeOfFrameError classifies a frame that could not be read.
func codeOfFrameError(err error) Code {
	switch {
	case errors.Is(err, ErrFrameTooLarge):
		return CodeTooLarge
	case errors.Is(err, ErrFrameNoMemory):
		return CodeBusy
	case isTimeout(err):
		return CodeTimeout
	}
	return CodeBadRequest
}

// refuse counts and resets a stream whose order cannot be answered (it
// could not be read, or is not to be relayed): the caller hears nothing
// from this node about it.
func (r *Relay) refuse(st network.Stream, from peer.ID, code Code, err error) {
	r.d.Server.count(code)
	r.d.Log.Debug("relay stream refused", "from", from, "code", code, "err", err)
	st.Reset()
}

// checkTime reports what is wrong with the order's deadline at now: past,
// or further than any call may ask for (its memory would be kept as long).
func checkTime(o *Order, now time.Time) *Error {
	switch left := o.Until(now); {
	case left <= 0:
		return Errorf(CodeTimeout, "the order's deadline passed %v before it arrived", -left.Round(time.Millisecond))
	case left > MaxTimeout+time.Minute:
		return Errorf(CodeBadRequest, "the order's deadline is %v away, further than the %v a call may ask for", left.Round(time.Second), MaxTimeout)
	}
	return nil
}

// taken is an order remembered: whose, until when, and, for an order
// run here, its answer.
type taken struct {
	caller   peer.ID
	deadline int64 // Unix ms
	// done is closed once answer is set (nil for an order relayed).
	done chan struct{}
	// answer is the signed answer frame, kept to be sent again when the
	// order comes again (its answer lost on the way); nil if it was too
	// large to keep or the budget was spent.
	answer []byte
}

// take remembers key (an order of caller's) until deadline. An order is
// taken once: replayed (by a relay, or anyone who saw it), it does not run
// again; take returns what was remembered of it then (t non-nil). A
// caller has at most maxRememberedPerCaller orders remembered at once, so
// that no one caller fills the memory the others' orders need.
func (r *Relay) take(caller peer.ID, key string, deadline int64, now time.Time, run bool) (t *taken, e *Error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, seen := r.ran[key]; seen {
		return t, nil
	}
	if len(r.ran) >= maxRemembered || r.takes[caller] >= maxRememberedPerCaller {
		r.forget(now)
		if len(r.ran) >= maxRemembered || r.takes[caller] >= maxRememberedPerCaller {
			return nil, Errorf(CodeBusy, "busy: %d orders in flight here, %d of them yours", len(r.ran), r.takes[caller])
		}
	}
	nt := &taken{caller: caller, deadline: deadline}
	if run {
		nt.done = make(chan struct{})
	}
	if len(r.ran) == 0 || deadline < r.earliest {
		r.earliest = deadline
	}
	r.ran[key] = nt
	r.takes[caller]++
	return nil, nil
}

// forget drops the orders whose deadlines passed by now, with their
// answers. r.mu is held.
func (r *Relay) forget(now time.Time) {
	ms := now.UnixMilli()
	if len(r.ran) == 0 || r.earliest >= ms {
		return
	}
	r.earliest = math.MaxInt64
	for k, t := range r.ran {
		if t.deadline < ms {
			delete(r.ran, k)
			r.kept -= len(t.answer)
			if r.takes[t.caller]--; r.takes[t.caller] <= 0 {
				delete(r.takes, t.caller)
			}
			continue
		}
		r.earliest = min(r.earliest, t.deadline)
	}
}

// answered keeps b, the answer frame of the order taken as key, if it is
// small enough and the budget allows (the answers of orders past their
// deadlines dropped first), and wakes whoever waits for it.
func (r *Relay) answered(key string, b []byte, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.ran[key]
	if t == nil || t.done == nil {
		return
	}
	if len(b) <= maxKeptAnswer && r.kept+len(b) > maxKeptAnswers {
		r.forget(now)
	}
	if len(b) <= maxKeptAnswer && r.kept+len(b) <= maxKeptAnswers {
		t.answer = b
		r.kept += len(b)
	}
	close(t.done)
}

// again is the answer frame for an order taken before (t): the answer
// it kept, waited for while the order still runs (until ctx's end), or
// a refusal.
func (r *Relay) again(ctx context.Context, t *taken) ([]byte, *Error) {
	if t.done == nil {
		return nil, Errorf(CodeBadRequest, "this node already took this order (an order runs once)")
	}
	select {
	case <-t.done:
	case <-ctx.Done():
		return nil, Errorf(CodeTimeout, "this node took this order before and had not answered it by the deadline")
	}
	r.mu.Lock()
	b := t.answer
	r.mu.Unlock()
	if b == nil {
		return nil, Errorf(CodeBadRequest, "this node already took this order (an order runs once; its answer went another way and was too large to keep)")
	}
	r.answersAgain.Add(1)
	return b, nil
}

// serve runs an order for this node and writes its signed answer.
func (r *Relay) serve(st network.Stream, o *Order, caller peer.ID) {
	defer st.Close()
	b := r.answer(o, caller)
	st.SetWriteDeadline(time.Now().Add(writeTimeout))
	if writeFrame(st, b) != nil {
		st.Reset()
	}
}

// answer runs o for this node if it may, and returns the signed answer
// frame, whatever the outcome. An order that came before is answered
// with the answer it got then.
func (r *Relay) answer(o *Order, caller peer.ID) []byte {
	self := r.d.Host.ID()
	now := time.Now()
	key := caller.String() + "/" + o.ID
	// Refusals made here are counted here; Serve counts its own.
	refuse := func(e *Error) Response {
		r.d.Server.count(e.Code)
		return failure(o.ID, e)
	}
	var replay []byte
	ran := false
	resp := func() Response {
		t, listed := o.Target(self)
		if !listed {
			return refuse(Errorf(CodeUnauthorized, "this node is not a target of the order"))
		}
		if err := checkTime(o, now); err != nil {
			return refuse(err)
		}
		if r.d.Counts != nil && !r.d.Counts(caller) {
			// Before the order is remembered: a stranger's orders
			// take no room from the members'.
			return refuse(Errorf(CodeUnauthorized, "the order's caller %s does not count here (no trusted writer admitted it)", caller))
		}
		// A run, or a wait for the first run's answer, holds one of the
		// caller's slots: a caller cannot park unbounded streams here.
		// Taken before the order is remembered: an order refused busy
		// may come again and run.
		if !r.d.Server.enter(caller) {
			return refuse(Errorf(CodeBusy, "busy: %d calls from you are already running or waiting here", MaxCallsPerCaller))
		}
		defer r.d.Server.leave(caller)
		ctx, cancel := context.WithDeadline(r.ctx, time.UnixMilli(o.Deadline))
		defer cancel()
		before, err := r.take(caller, key, o.Deadline, now, true)
		if err != nil {
			return refuse(err)
		}
		if before != nil {
			b, err := r.again(ctx, before)
			if err != nil {
				return refuse(err)
			}
			replay = b
			return Response{}
		}
		ran = true
		r.runs.Add(1)
		req := o.Request(t)
		req.Deadline = max(1, o.Until(now).Milliseconds())
		return r.d.Server.Serve(ctx, caller, req)
	}()
	if replay != nil {
		return replay
	}
	b, err := sealAnswerFrame(&Answer{Order: o.ID, Caller: caller, Response: resp}, r.d.Key)
	if err != nil {
		// Only a result that is not JSON fails to encode.
		b, _ = sealAnswerFrame(&Answer{Order: o.ID, Caller: caller, Response: Response{ID: o.ID, Code: CodeFailed,
			Duration: resp.Duration, Error: "the plugin returned a result that is not JSON: " + err.Error()}}, r.d.Key)
	}
	if ran {
		r.answered(key, b, time.Now())
	}
	return b
}

// sealAnswerFrame is a's FrameAnswer, its result replaced by a too_large
// error if it would not fit one.
func sealAnswerFrame(a *Answer, key crypto.PrivKey) ([]byte, error) {
	if len(a.Response.Result) > MaxResponseSize-1024 {
		r := a.Response
		a.Response = Response{ID: r.ID, Code: CodeTooLarge, Duration: r.Duration,
			Error: "the result is " + byteSize(len(r.Result)) + ", over the " + byteSize(MaxResponseSize) + " a response may carry"}
	}
	b, err := SealAnswer(a, key)
	if err != nil {
		return nil, err
	}
	return relayFrame(FrameAnswer, b), nil
}

// relay passes an order on to each of its targets (running it here too if
// this node is one), dialling those it holds no connection to only if
// dial, and writes each outcome back as it comes: the target's signed
// answer as it was, or a note.
func (r *Relay) relay(st network.Stream, o *Order, caller peer.ID, sealed []byte, dial bool) {
	now := time.Now()
	if r.d.Counts != nil && !r.d.Counts(caller) {
		r.refuse(st, caller, CodeUnauthorized, errors.New("plugins: the order's caller does not count here"))
		return
	}
	if err := checkTime(o, now); err != nil {
		r.refuse(st, caller, CodeBadRequest, err)
		return
	}
	// Each signed order is relayed once (a caller signs one per relay and
	// round, under one ID).
	sum := sha256.Sum256(sealed)
	if before, err := r.take(caller, "r/"+string(sum[:]), o.Deadline, now, false); err != nil || before != nil {
		if err == nil {
			err = Errorf(CodeBadRequest, "this node relayed this order before")
		}
		r.refuse(st, caller, err.Code, err)
		return
	}
	if !r.relaying.Acquire(caller) {
		r.refuse(st, caller, CodeBusy, errors.New("plugins: too many orders relayed at once"))
		return
	}
	defer r.relaying.Release(caller)
	ctx, cancel := context.WithDeadline(r.ctx, time.UnixMilli(o.Deadline))
	defer cancel()
	// The caller going away (a reset) ends the order's calls; it sends
	// nothing more, and may close its side.
	go func() {
		var one [1]byte
		if _, err := st.Read(one[:]); err != io.EOF {
			cancel()
		}
	}()
	var (
		wmu    sync.Mutex
		broken bool
		wg     sync.WaitGroup
	)
	send := func(b []byte) {
		wmu.Lock()
		defer wmu.Unlock()
		if broken {
			return
		}
		st.SetWriteDeadline(time.Now().Add(writeTimeout))
		if writeFrame(st, b) != nil {
			broken = true
			cancel()
		}
	}
	frame := relayFrame(ModeServe, sealed)
	sem := make(chan struct{}, relayParallel)
	for _, t := range o.Targets {
		if t.Node == r.d.Host.ID() {
			wg.Go(func() { send(r.answer(o, caller)) })
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			send(noteFrame(Note{Node: t.Node, Code: CodeTimeout, Error: "the relay's deadline passed before it called the node"}))
			continue
		}
		if !dial && r.d.Host.Network().Connectedness(t.Node) != network.Connected {
			<-sem
			send(noteFrame(Note{Node: t.Node, Code: CodeUnreachable, Error: "relayed by " + r.d.Host.ID().String() + ": not connected to the node"}))
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			send(r.forward(ctx, t.Node, frame))
		})
	}
	wg.Wait()
	wmu.Lock()
	defer wmu.Unlock()
	if broken {
		st.Reset()
		return
	}
	st.Close()
}

// forward hands the order (its ModeServe frame) to node and returns what
// to pass back: the node's answer frame unread (the caller checks it), or
// a note.
func (r *Relay) forward(ctx context.Context, node peer.ID, frame []byte) []byte {
	if r.d.Reach != nil {
		r.d.Reach(node)
	}
	if r.d.Use != nil {
		defer r.d.Use(node)()
	}
	relayed := "relayed by " + r.d.Host.ID().String() + ": "
	st, err := r.d.Host.NewStream(ctx, node, RelayProtocol)
	if err != nil {
		return noteFrame(Note{Node: node, Code: CodeUnreachable, Error: relayed + "cannot reach the node: " + err.Error()})
	}
	stop := context.AfterFunc(ctx, func() { st.Reset() })
	defer stop()
	st.SetWriteDeadline(time.Now().Add(writeTimeout))
	if err := writeFrame(st, frame); err != nil {
		st.Reset()
		return noteFrame(Note{Node: node, Code: CodeUnreachable, Error: relayed + "sending the order: " + err.Error()})
	}
	st.CloseWrite()
	b, held, err := readFrame(bufio.NewReader(st), maxAnswerSize, st.Scope())
	if err != nil {
		st.Reset()
		if ctx.Err() != nil {
			return noteFrame(Note{Node: node, Delivered: true, Code: CodeTimeout, Error: relayed + "no answer before the deadline"})
		}
		return noteFrame(Note{Node: node, Delivered: true, Code: CodeGone, Error: relayed + "the node went away mid-call: " + err.Error()})
	}
	defer st.Scope().ReleaseMemory(held)
	st.Close()
	if len(b) == 0 || b[0] != FrameAnswer {
		return noteFrame(Note{Node: node, Delivered: true, Code: CodeBadResponse, Error: relayed + "the node answered with something else than an answer"})
	}
	return b
}

// noteFrame is n's FrameNote.
func noteFrame(n Note) []byte {
	b, _ := json.Marshal(n)
	return relayFrame(FrameNote, b)
}
