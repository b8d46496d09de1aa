package swim

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Kind is what a frame is.
type Kind uint8

const (
	KindPing    Kind = 1 // probe or gossip: answer with an ack
	KindPingReq Kind = 2 // probe Target for the sender: ack if it answered, else nack
	KindAck     Kind = 3
	KindNack    Kind = 4 // the target of a ping-req did not answer
	KindSync    Kind = 5 // a snapshot: answer with one's own (push-pull)
	// KindBusy answers a ping that the node had no room to take: it is
	// alive, and took none of the message (see ErrBusy).
	KindBusy Kind = 6
)

// Frame is one message on the wire: the node carries one frame each way
// per stream.
type Frame struct {
	Kind   Kind
	Target string // KindPingReq only
	Msg    Message
}

// Wire limits: a frame over MaxFrame bytes (MaxSyncFrame for a
// snapshot) is not read; update counts over maxWireUpdate (MaxSnapshot)
// are refused. Names and signatures are at most 255 bytes.
const (
	MaxFrame      = 64 << 10
	MaxSyncFrame  = 2 << 20
	maxWireUpdate = 64
)

// maxUpdates is how many updates a frame of kind k may carry.
func maxUpdates(k Kind) int {
	if k == KindSync {
		return MaxSnapshot
	}
	return maxWireUpdate
}

// ErrFrame is what a frame that does not decode gets.
var ErrFrame = errors.New("swim: bad frame")

// AppendFrame appends f's encoding to b: kind, target, the number of
// updates, then each as node, state, incarnation (uvarint), from and
// signature, every string with a one-byte length. Updates past
// maxWireUpdate, and names or signatures over their limits, are a bug of
// the caller's and are refused by the receiver.
func AppendFrame(b []byte, f Frame) []byte {
	b = append(b, byte(f.Kind))
	b = appendString(b, f.Target)
	us := f.Msg.Updates[:min(len(f.Msg.Updates), maxUpdates(f.Kind))]
	b = binary.AppendUvarint(b, uint64(len(us)))
	for _, u := range us {
		b = appendString(b, u.Node)
		b = append(b, byte(u.State))
		b = binary.AppendUvarint(b, u.Incarnation)
		b = appendString(b, u.From)
		b = appendString(b, string(u.Sig))
	}
	return b
}

func appendString(b []byte, s string) []byte {
	return append(append(b, byte(min(len(s), 255))), s[:min(len(s), 255)]...)
}

// DecodeFrame decodes a frame, strictly: a known kind, a target exactly
// for a ping-req, known states, non-empty names, and no byte left over.
func DecodeFrame(b []byte) (Frame, error) {
	if len(b) > MaxSyncFrame {
		return Frame{}, fmt.Errorf("%w: %d bytes, at most %d", ErrFrame, len(b), MaxSyncFrame)
	}
	d := decoder{b: b}
	f := Frame{Kind: Kind(d.byte())}
	if f.Kind != KindSync && len(b) > MaxFrame {
		return Frame{}, fmt.Errorf("%w: %d bytes, at most %d", ErrFrame, len(b), MaxFrame)
	}
	f.Target = d.string()
	n := d.uvarint()
	if d.err == nil && n > uint64(maxUpdates(f.Kind)) {
		d.fail("%d updates, at most %d", n, maxUpdates(f.Kind))
	}
	for i := 0; i < int(n) && d.err == nil; i++ {
		u := Update{Node: d.string(), State: State(d.byte()), Incarnation: d.uvarint(), From: d.string()}
		if sig := d.string(); sig != "" {
			u.Sig = []byte(sig)
		}
		switch {
		case d.err != nil:
		case u.Node == "" || u.From == "":
			d.fail("update %d: no node or no accuser", i)
		case u.State > Left:
			d.fail("update %d: state %d", i, u.State)
		}
		f.Msg.Updates = append(f.Msg.Updates, u)
	}
	switch {
	case d.err != nil:
		return Frame{}, d.err
	case len(d.b) > 0:
		return Frame{}, fmt.Errorf("%w: %d bytes after the frame", ErrFrame, len(d.b))
	case f.Kind < KindPing || f.Kind > KindBusy:
		return Frame{}, fmt.Errorf("%w: kind %d", ErrFrame, f.Kind)
	case (f.Kind == KindPingReq) != (f.Target != ""):
		return Frame{}, fmt.Errorf("%w: a target is for a ping-req, and a ping-req needs one", ErrFrame)
	case f.Kind == KindBusy && len(f.Msg.Updates) > 0:
		return Frame{}, fmt.Errorf("%w: a busy answer carries no updates", ErrFrame)
	}
	return f, nil
}

// decoder reads a frame, remembering its first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrFrame}, args...)...)
	}
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail("truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) string() string {
	n := int(d.byte())
	if d.err != nil {
		return ""
	}
	if len(d.b) < n {
		d.fail("truncated")
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || n != len(binary.AppendUvarint(nil, v)) { // one encoding per value
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}
