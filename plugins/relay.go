package plugins

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/record"

	"github.com/tribeagent/tribe/internal/edsigner"
	"github.com/tribeagent/tribe/plugins/jsonerr"
)

// RelayProtocol carries calls that a caller signed, so that they can reach
// their targets through other nodes: a fan-out to hosts the caller holds
// no connection to hands each connected member (a relay) a share of them,
// and the relay makes the calls over its own connections and dials, instead
// of the caller opening one connection (a Noise handshake) per host. On a
// loaded fleet those handshakes were the caller's whole budget: a fan-out
// from one agent of 200 on a 2-core machine answered about one host a
// second.
//
// A stream carries one order: the caller (or a relay) writes a frame, a
// mode byte then the order's signed envelope. ModeRelay asks the node to
// call every target of the order but itself, and itself too if listed;
// ModeNear the same, but only the targets it holds a connection to (it
// dials none, and notes the others at once); ModeServe asks it to run the
// order for itself only (it must be listed). Only the order's signer
// hands it over in ModeRelay or ModeNear. A caller may sign several
// orders with one ID, each for some targets (one per relay and round):
// a target runs one ID once.
// The node writes back one frame per target as each finishes, then closes
// the stream: FrameAnswer and an answer envelope the target signed, or
// FrameNote and a Note, the relay's own word on a target it could not get
// an answer from.
//
// Authority stays with the caller's signature: a target runs an order only
// if its signer may call the plugin here (as if it had called directly),
// lists this node, and has not passed its deadline; and runs each order at
// most once (a relay, or anyone who saw the order, cannot make it run
// twice). A relay cannot forge an answer: each is signed by its target,
// and names the order and the caller.
const RelayProtocol = "/tribe/relay/1.0.0"

// Modes and frame kinds of RelayProtocol.
const (
	ModeRelay   byte = 'r'
	ModeNear    byte = 'c'
	ModeServe   byte = 's'
	FrameAnswer byte = 'a'
	FrameNote   byte = 'n'
)

// Limits of an order.
const (
	// MaxOrderTargets bounds the targets one order names: a relay takes
	// at most this many at once.
	MaxOrderTargets = 256
	// maxOrderSize caps an order's frame: the request and its targets.
	maxOrderSize = MaxRequestSize + MaxOrderTargets*128
	// maxAnswerSize caps an answer's frame: the response and its
	// signature.
	maxAnswerSize = MaxResponseSize + 4096
)

// Errors of orders and answers.
var (
	ErrBadOrder  = errors.New("plugins: bad order")
	ErrBadAnswer = errors.New("plugins: bad answer")
)

// OrderTarget is one node an order is for, and the tribe the call is made
// in there.
type OrderTarget struct {
	Node  peer.ID `json:"node"`
	Tribe string  `json:"tribe,omitempty"`
}

// Order is a call its caller signed for a set of targets (the signer is
// the caller). Deadline is absolute, in Unix milliseconds: a relay's hop
// must not stretch it.
type Order struct {
	ID       string          `json:"id"`
	Plugin   string          `json:"plugin"`
	Method   string          `json:"method"`
	Args     json.RawMessage `json:"args,omitempty"`
	Deadline int64           `json:"deadline"`
	Targets  []OrderTarget   `json:"targets"`
}

var (
	orderDomain  = "tribe-call-order"
	orderCodec   = []byte("/tribe/call-order")
	answerDomain = "tribe-call-answer"
	answerCodec  = []byte("/tribe/call-answer")
)

func (*Order) Domain() string { return orderDomain }
func (*Order) Codec() []byte  { return orderCodec }

func (o *Order) MarshalRecord() ([]byte, error) { return json.Marshal(o) }

func (o *Order) UnmarshalRecord(b []byte) error {
	if err := json.Unmarshal(b, o); err != nil {
		return fmt.Errorf("%w: %v", ErrBadOrder, jsonerr.Plain(err))
	}
	return o.Check()
}

// Check reports what is wrong with an order.
func (o *Order) Check() error {
	switch {
	case o.ID == "":
		return fmt.Errorf("%w: no id", ErrBadOrder)
	case o.Deadline <= 0:
		return fmt.Errorf("%w: no deadline", ErrBadOrder)
	case len(o.Targets) == 0 || len(o.Targets) > MaxOrderTargets:
		return fmt.Errorf("%w: %d targets, from 1 to %d", ErrBadOrder, len(o.Targets), MaxOrderTargets)
	}
	seen := make(map[peer.ID]bool, len(o.Targets))
	for _, t := range o.Targets {
		if seen[t.Node] || t.Node.Validate() != nil {
			return fmt.Errorf("%w: target %q twice or not a peer ID", ErrBadOrder, t.Node)
		}
		seen[t.Node] = true
		if err := o.Request(t).Check(); err != nil {
			return fmt.Errorf("%w: %w", ErrBadOrder, err)
		}
	}
	return nil
}

// Target is what the order says about node, if it lists it.
func (o *Order) Target(node peer.ID) (OrderTarget, bool) {
	for _, t := range o.Targets {
		if t.Node == node {
			return t, true
		}
	}
	return OrderTarget{}, false
}

// Request is the call the order makes on t (its deadline relative, as the
// call protocol's, filled in by whoever runs it).
func (o *Order) Request(t OrderTarget) Request {
	return Request{ID: o.ID, Tribe: t.Tribe, Plugin: o.Plugin, Method: o.Method, Args: o.Args}
}

// Until is how long the order has left at now.
func (o *Order) Until(now time.Time) time.Duration {
	return time.UnixMilli(o.Deadline).Sub(now)
}

// SealOrder signs o with the caller's key, for ModeRelay or ModeServe
// frames.
func SealOrder(o *Order, key crypto.PrivKey) ([]byte, error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	env, err := record.Seal(o, key)
	if err != nil {
		return nil, err
	}
	return env.Marshal()
}

// OpenOrder checks an order's signature and contents, and returns it with
// its signer (the caller).
func OpenOrder(b []byte) (*Order, peer.ID, error) {
	var o Order
	caller, err := openSigned(b, &o, ErrBadOrder)
	if err != nil {
		return nil, "", err
	}
	return &o, caller, nil
}

// openSigned opens the signed envelope b into rec, checking its signature,
// its payload type and rec's own checks, and returns its signer; every
// failure wraps bad.
func openSigned(b []byte, rec record.Record, bad error) (peer.ID, error) {
	// A key no agent has is refused before the signature is checked.
	if _, err := edsigner.Read(b); err != nil {
		return "", fmt.Errorf("%w: %w", bad, err)
	}
	env, err := record.ConsumeTypedEnvelope(b, rec)
	if err != nil {
		if errors.Is(err, bad) {
			return "", err
		}
		return "", fmt.Errorf("%w: %v", bad, err)
	}
	if !bytes.Equal(env.PayloadType, rec.Codec()) {
		return "", fmt.Errorf("%w: payload type %q", bad, env.PayloadType)
	}
	signer, err := peer.IDFromPublicKey(env.PublicKey)
	if err != nil {
		return "", fmt.Errorf("%w: signer: %v", bad, err)
	}
	return signer, nil
}

// Answer is a target's answer to an order, signed by the target.
type Answer struct {
	Order    string   `json:"order"`
	Caller   peer.ID  `json:"caller"`
	Response Response `json:"response"`
}

func (*Answer) Domain() string { return answerDomain }
func (*Answer) Codec() []byte  { return answerCodec }

func (a *Answer) MarshalRecord() ([]byte, error) { return json.Marshal(a) }

func (a *Answer) UnmarshalRecord(b []byte) error {
	if err := json.Unmarshal(b, a); err != nil {
		return fmt.Errorf("%w: %v", ErrBadAnswer, jsonerr.Plain(err))
	}
	switch r := a.Response; {
	case a.Order == "" || r.ID != a.Order:
		return fmt.Errorf("%w: for order %q, response to %q", ErrBadAnswer, a.Order, r.ID)
	case !r.OK && r.Error == "":
		return fmt.Errorf("%w: not ok and no error", ErrBadAnswer)
	case !r.OK && !r.Code.Known():
		return fmt.Errorf("%w: code %q", ErrBadAnswer, r.Code)
	}
	return nil
}

// SealAnswer signs a's answer with the target's key.
func SealAnswer(a *Answer, key crypto.PrivKey) ([]byte, error) {
	env, err := record.Seal(a, key)
	if err != nil {
		return nil, err
	}
	return env.Marshal()
}

// OpenAnswer checks an answer's signature and contents, and returns it
// with its signer (the target).
func OpenAnswer(b []byte) (*Answer, peer.ID, error) {
	var a Answer
	target, err := openSigned(b, &a, ErrBadAnswer)
	if err != nil {
		return nil, "", err
	}
	return &a, target, nil
}

// Note is a relay's word on a target of an order it got no answer from.
// Delivered says whether the relay handed the order over: a target it
// did not reach may be called again (directly), one it did may have run
// it (and will refuse it again: an order runs once).
type Note struct {
	Node      peer.ID `json:"node"`
	Delivered bool    `json:"delivered"`
	Code      Code    `json:"code"`
	Error     string  `json:"error"`
}

// DecodeNote parses a FrameNote's body.
func DecodeNote(b []byte) (Note, error) {
	var n Note
	if err := json.Unmarshal(b, &n); err != nil {
		return Note{}, fmt.Errorf("plugins: bad note: %v", jsonerr.Plain(err))
	}
	if n.Node.Validate() != nil || !n.Code.Known() || n.Error == "" {
		return Note{}, errors.New("plugins: bad note: no node, code or error")
	}
	return n, nil
}

// relayFrame is a frame of RelayProtocol: its kind, then its body.
func relayFrame(kind byte, body []byte) []byte {
	return append([]byte{kind}, body...)
}

// splitFrame parses a frame of RelayProtocol into its kind and body.
func splitFrame(b []byte) (byte, []byte, error) {
	if len(b) < 2 {
		return 0, nil, errors.New("plugins: relay frame too short")
	}
	return b[0], bytes.Clone(b[1:]), nil
}
