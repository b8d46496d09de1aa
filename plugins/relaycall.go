package plugins

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// RelayOutcome is what became of one target of an order handed to a
// relay.
type RelayOutcome struct {
	Node     peer.ID
	Response Response
	// Again: no answer signed by the node came back, only the relay's
	// word (a note: it could not reach the node, the answer was lost on
	// the way, the node timed out or answered garbage), or nothing before
	// the relay went away, so it may be sent to the node again, directly
	// (Caller.Order) or through another relay. The node runs an order
	// once, and answers it again with the answer it kept.
	Again bool
}

// Relay hands the order o (sealed by this node: SealOrder) to via in
// ModeRelay (dial: the relay dials targets it holds no connection to) or
// ModeNear, and reports each of its targets' outcomes to out as they
// come, one at a time: the targets' signed answers, checked here, and the
// relay's notes. Targets the relay says nothing of before it closes the
// stream or ctx ends are reported last, Again set (after ctx's end, as a
// timeout). via should be a node this one holds a connection to.
func (c *Caller) Relay(ctx context.Context, via peer.ID, o *Order, sealed []byte, dial bool, out func(RelayOutcome)) {
	mode := ModeNear
	if dial {
		mode = ModeRelay
	}
	pending := make(map[peer.ID]bool, len(o.Targets))
	for _, t := range o.Targets {
		pending[t.Node] = true
	}
	report := func(oc RelayOutcome) {
		delete(pending, oc.Node)
		out(oc)
	}
	why := func() string {
		st, err := c.host.NewStream(ctx, via, RelayProtocol)
		if err != nil {
			return "cannot reach the relay " + via.String() + ": " + err.Error()
		}
		stop := context.AfterFunc(ctx, func() { st.Reset() })
		defer stop()
		st.SetWriteDeadline(time.Now().Add(writeTimeout))
		if err := writeFrame(st, relayFrame(mode, sealed)); err != nil {
			st.Reset()
			return "sending the order to the relay " + via.String() + ": " + err.Error()
		}
		br := bufio.NewReader(st)
		for len(pending) > 0 {
			b, held, err := readFrame(br, maxAnswerSize, st.Scope())
			if err != nil {
				st.Reset()
				if err == io.EOF {
					return "the relay " + via.String() + " said nothing of it"
				}
				return "the relay " + via.String() + " went away: " + err.Error()
			}
			oc, err := c.relayed(b, o, pending)
			st.Scope().ReleaseMemory(held)
			if err != nil {
				st.Reset()
				return "the relay " + via.String() + " broke the protocol: " + err.Error()
			}
			report(oc)
		}
		st.Close()
		return ""
	}()
	for _, t := range o.Targets {
		if !pending[t.Node] {
			continue
		}
		if r, ok := ctxFailure(ctx, o.ID); ok {
			report(RelayOutcome{Node: t.Node, Response: r})
			continue
		}
		report(RelayOutcome{Node: t.Node, Again: true, Response: Response{ID: o.ID, Code: CodeGone, Error: why}})
	}
}

// relayed checks a frame a relay passed back for o: an answer signed by a
// target still pending, for this order and this caller, or the relay's
// note on such a target.
func (c *Caller) relayed(b []byte, o *Order, pending map[peer.ID]bool) (RelayOutcome, error) {
	kind, body, err := splitFrame(b)
	if err != nil {
		return RelayOutcome{}, err
	}
	switch kind {
	case FrameAnswer:
		a, target, err := c.checkAnswer(body, o)
		if err != nil {
			return RelayOutcome{}, err
		}
		if !pending[target] {
			return RelayOutcome{}, fmt.Errorf("%w: from %s, not a target still waited for", ErrBadAnswer, target)
		}
		return RelayOutcome{Node: target, Response: a.Response}, nil
	case FrameNote:
		n, err := DecodeNote(body)
		if err != nil {
			return RelayOutcome{}, err
		}
		if !pending[n.Node] {
			return RelayOutcome{}, fmt.Errorf("plugins: a note on %s, not a target still waited for", n.Node)
		}
		// A note is the relay's word, not the target's: a target the
		// relay did not hand the order to, one whose answer was lost on
		// the way (gone), and one the relay says timed out or answered
		// garbage may all be sent the order again, by another relay or
		// directly, while the call's time lasts. The target runs it once
		// and answers again with the answer it kept, so a relay that
		// lies about its targets (says they timed out) costs the caller
		// a second try, not their answers. The note's Response is only
		// the relay's word: the node's caller (callThrough) never records
		// it, and past the call's time records such a target timed out,
		// as it does any target handed back then.
		return RelayOutcome{Node: n.Node, Again: true, Response: Response{ID: o.ID, Code: n.Code, Error: n.Error}}, nil
	}
	return RelayOutcome{}, fmt.Errorf("plugins: relay frame kind %q", kind)
}

// checkAnswer opens an answer to o and checks it is one: for o, to this
// caller. Who signed it (a target waited for) is the caller's to check.
func (c *Caller) checkAnswer(body []byte, o *Order) (*Answer, peer.ID, error) {
	a, target, err := OpenAnswer(body)
	if err != nil {
		return nil, "", err
	}
	if a.Order != o.ID || a.Caller != c.host.ID() {
		return nil, "", fmt.Errorf("%w: from %s for order %q to %s: not this order's", ErrBadAnswer, target, a.Order, a.Caller)
	}
	a.Response.ID = o.ID
	return a, target, nil
}

// Order sends the order o (sealed by this node) to p directly in
// ModeServe, and returns p's answer. A dial waits for room in the dial
// window, as a call's does. An order that could not be written, and an
// answer lost on the way (the stream or its connection broke), are marked
// to be sent again: p runs the order once, and answers the same order
// again with the answer it kept.
func (c *Caller) Order(ctx context.Context, p peer.ID, o *Order, sealed []byte) Response {
	st, err := c.newStream(ctx, p, RelayProtocol)
	if err != nil {
		return openFailure(ctx, o.ID, err)
	}
	stop := context.AfterFunc(ctx, func() { st.Reset() })
	defer stop()
	st.SetWriteDeadline(time.Now().Add(writeTimeout))
	if err := writeFrame(st, relayFrame(ModeServe, sealed)); err != nil {
		st.Reset()
		if r, ok := ctxFailure(ctx, o.ID); ok {
			return r
		}
		// Sent again, it runs once all the same (FanOut does, while ctx
		// lasts).
		return Response{ID: o.ID, Code: CodeUnreachable, Error: "sending the order: " + err.Error(), again: true}
	}
	st.CloseWrite()
	b, held, err := readFrame(bufio.NewReader(st), maxAnswerSize, st.Scope())
	if err != nil {
		st.Reset()
		if r, ok := ctxFailure(ctx, o.ID); ok {
			return r
		}
		// The node runs the order once and keeps its answer: sent
		// again, it answers again (FanOut does, while ctx lasts).
		return Response{ID: o.ID, Code: CodeGone, Error: "the node went away mid-call: " + err.Error(), again: true}
	}
	defer st.Scope().ReleaseMemory(held)
	st.Close()
	kind, body, err := splitFrame(b)
	if err == nil && kind != FrameAnswer {
		err = fmt.Errorf("%w: frame kind %q", ErrBadAnswer, kind)
	}
	var a *Answer
	var from peer.ID
	if err == nil {
		a, from, err = c.checkAnswer(body, o)
	}
	if err == nil && from != p {
		err = fmt.Errorf("%w: signed by %s, not the node called", ErrBadAnswer, from)
	}
	if err != nil {
		return Response{ID: o.ID, Code: CodeBadResponse, Error: err.Error()}
	}
	return a.Response
}
