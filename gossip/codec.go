package gossip

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/tribeagent/tribe/internal/growbuf"
)

// Wire format of the sync protocol: each message is a uvarint length and
// a body. Bodies start with a type byte; counts are uvarints; hashes are
// 8 bytes big-endian. Decoders check every count against what the input
// can hold before allocating, so hostile input costs at most its size.

// MaxSyncMessage bounds one sync message.
const MaxSyncMessage = 4 << 20

const (
	msgRequest  = 'Q'
	msgResponse = 'R'
)

// Limits on counts in one message.
const (
	maxProbes  = 1 << 17
	maxWants   = 1 << 17
	maxEntries = 1 << 14
)

// ErrBadSyncMessage is returned for sync bytes that do not decode.
var ErrBadSyncMessage = errors.New("gossip: bad sync message")

func badSync(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadSyncMessage, fmt.Sprintf(format, args...))
}

// EncodeRequest encodes a request body.
func EncodeRequest(r SyncRequest) []byte {
	b := make([]byte, 0, 1+len(r.Probes)*18+len(r.Want)*8+16)
	b = append(b, msgRequest)
	b = binary.AppendUvarint(b, uint64(len(r.Probes)))
	for _, p := range r.Probes {
		b = appendNode(b, p.Node)
		b = binary.BigEndian.AppendUint64(b, p.Hash)
	}
	b = binary.AppendUvarint(b, uint64(len(r.Want)))
	for _, w := range r.Want {
		b = binary.BigEndian.AppendUint64(b, w)
	}
	return b
}

// EncodeResponse encodes a response body.
func EncodeResponse(r SyncResponse) []byte {
	size := 16
	for _, e := range r.Entries {
		size += len(e) + 4
	}
	b := make([]byte, 0, size+len(r.Nodes)*140)
	b = append(b, msgResponse)
	b = binary.AppendUvarint(b, uint64(len(r.Nodes)))
	for _, n := range r.Nodes {
		b = appendNode(b, n.Node)
		if n.Children != nil {
			b = append(b, 0)
			for _, h := range n.Children {
				b = binary.BigEndian.AppendUint64(b, h)
			}
			continue
		}
		b = append(b, 1)
		b = binary.AppendUvarint(b, uint64(len(n.Items)))
		for _, it := range n.Items {
			b = binary.BigEndian.AppendUint64(b, it.KeyHash)
			b = binary.BigEndian.AppendUint64(b, it.VersionHash)
		}
	}
	b = binary.AppendUvarint(b, uint64(r.Served))
	b = binary.AppendUvarint(b, uint64(len(r.Entries)))
	for _, e := range r.Entries {
		b = binary.AppendUvarint(b, uint64(len(e)))
		b = append(b, e...)
	}
	return b
}

func appendNode(b []byte, n NodeRef) []byte {
	b = append(b, n.Depth)
	return binary.AppendUvarint(b, n.Value)
}

// reader decodes with bounds checks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) byte() byte {
	if r.err != nil || len(r.b) < 1 {
		r.fail("truncated")
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) u64() uint64 {
	if r.err != nil || len(r.b) < 8 {
		r.fail("truncated")
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, k := uvarint(r.b)
	if k <= 0 {
		r.fail("bad varint")
		return 0
	}
	r.b = r.b[k:]
	return v
}

// count reads a count of items of at least minSize bytes each, refusing
// more than limit or more than the rest of the input could hold.
func (r *reader) count(limit, minSize int) int {
	n := r.uvarint()
	if r.err == nil && (n > uint64(limit) || n*uint64(minSize) > uint64(len(r.b))) {
		r.fail("count %d too large", n)
		return 0
	}
	return int(n)
}

func (r *reader) node() NodeRef {
	n := NodeRef{Depth: r.byte(), Value: r.uvarint()}
	if r.err == nil && !n.valid() {
		r.fail("bad node %d/%x", n.Depth, n.Value)
	}
	return n
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = badSync(format, args...)
	}
}

func (r *reader) end() error {
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	return r.err
}

// DecodeRequest decodes a request body from the network.
func DecodeRequest(b []byte) (SyncRequest, error) {
	var req SyncRequest
	r := &reader{b: b}
	if r.byte() != msgRequest {
		return req, badSync("not a request")
	}
	n := r.count(maxProbes, 10)
	req.Probes = make([]Probe, 0, n)
	for range n {
		req.Probes = append(req.Probes, Probe{Node: r.node(), Hash: r.u64()})
	}
	n = r.count(maxWants, 8)
	req.Want = make([]uint64, 0, n)
	for range n {
		req.Want = append(req.Want, r.u64())
	}
	return req, r.end()
}

// DecodeResponse decodes a response body from the network.
func DecodeResponse(b []byte) (SyncResponse, error) {
	var resp SyncResponse
	r := &reader{b: b}
	if r.byte() != msgResponse {
		return resp, badSync("not a response")
	}
	n := r.count(maxProbes, 3)
	resp.Nodes = make([]NodeReply, 0, n)
	for range n {
		reply := NodeReply{Node: r.node()}
		switch r.byte() {
		case 0:
			reply.Children = make([]uint64, 16)
			for i := range reply.Children {
				reply.Children[i] = r.u64()
			}
		case 1:
			k := r.count(maxWants, 16)
			reply.Items = make([]ItemSummary, 0, k)
			for range k {
				reply.Items = append(reply.Items, ItemSummary{r.u64(), r.u64()})
			}
		default:
			r.fail("bad node reply kind")
		}
		if r.err != nil {
			return resp, r.err
		}
		resp.Nodes = append(resp.Nodes, reply)
	}
	served := r.uvarint()
	if served > maxWants {
		r.fail("served %d", served)
	}
	resp.Served = int(served)
	n = r.count(maxEntries, 1)
	for range n {
		size := r.count(MaxEntrySize, 1)
		if r.err != nil {
			break
		}
		resp.Entries = append(resp.Entries, r.b[:size:size])
		r.b = r.b[size:]
	}
	return resp, r.end()
}

// WriteMsg writes one length-prefixed message.
func WriteMsg(w io.Writer, body []byte) error {
	if len(body) > MaxSyncMessage {
		return badSync("message of %d bytes over the limit", len(body))
	}
	b := binary.AppendUvarint(make([]byte, 0, len(body)+binary.MaxVarintLen32), uint64(len(body)))
	_, err := w.Write(append(b, body...))
	return err
}

// Memory is what ReadMsg reserves a message's buffer on before growing
// it (growbuf.Memory). network.ResourceScope has these methods: a sync
// stream passes its scope, so the resource manager's limits (system,
// protocol, peer) cover sync buffers as they do libp2p's own, in both
// directions, and a peer cannot make this node hold more than they allow.
type Memory = growbuf.Memory

var (
	// ErrSyncTruncated is a sync message whose stream ended or failed
	// after its first byte.
	ErrSyncTruncated = errors.New("gossip: sync message cut short")
	// ErrSyncNoMemory is a sync message the memory scope would not hold.
	ErrSyncNoMemory = errors.New("gossip: no memory for sync message")
)

// readChunk is the buffer a message starts with; it doubles as bytes
// arrive, up to the declared length.
const readChunk = growbuf.Chunk

// maxLengthBytes is the longest length prefix: that of MaxSyncMessage.
var maxLengthBytes = varintLen(MaxSyncMessage)

// ReadMsg reads one length-prefixed message of at most MaxSyncMessage.
//
// It never allocates the declared length up front: the buffer starts at
// readChunk and doubles as bytes arrive, so a peer that declares 4 MiB and
// sends 3 bytes makes this node hold 4 KiB, not 4 MiB. Every growth is
// reserved on mem first (at network.ReservationPriorityMedium: refused
// once the scope is 60% used, leaving room for libp2p's own needs); mem
// nil accounts nothing. held is what stays reserved for the returned
// message: the caller releases it with mem.ReleaseMemory(held) once done
// with b. On error nothing stays reserved.
//
// Errors: the stream's own error, as is, if it ends or fails before the
// message's first byte (io.EOF: the peer is done); ErrBadSyncMessage for a
// length prefix over the limit or not in its shortest form; ErrSyncTruncated
// for an end or failure inside the message; ErrSyncNoMemory.
func ReadMsg(r *bufio.Reader, mem Memory) (b []byte, held int, err error) {
	n, err := readLength(r)
	if err != nil {
		return nil, 0, err
	}
	b, held, err = growbuf.Read(r, n, mem)
	switch {
	case errors.Is(err, growbuf.ErrNoMemory):
		return nil, 0, fmt.Errorf("%w: %w", ErrSyncNoMemory, err)
	case err != nil:
		return nil, 0, fmt.Errorf("%w: %w", ErrSyncTruncated, err)
	}
	return b, held, nil
}

// readLength reads a message's length prefix: a uvarint in its shortest
// form, at most MaxSyncMessage. It stops at the first byte that makes the
// length too long, so a hostile prefix costs at most maxLengthBytes reads.
func readLength(r *bufio.Reader) (int, error) {
	var n uint64
	for i := 0; ; i++ {
		c, err := r.ReadByte()
		if err != nil {
			if i == 0 {
				return 0, err // between messages: the stream's own end
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, fmt.Errorf("%w: in the length: %w", ErrSyncTruncated, err)
		}
		n |= uint64(c&0x7f) << (7 * i)
		more := c >= 0x80
		switch {
		case n > MaxSyncMessage || more && i+1 == maxLengthBytes:
			return 0, badSync("message over the limit of %d bytes", MaxSyncMessage)
		case more:
		case c == 0 && i > 0:
			return 0, badSync("length not in its shortest form")
		default:
			return int(n), nil
		}
	}
}

// uvarint is binary.Uvarint that also refuses non-minimal encodings, so
// every message has exactly one encoding.
func uvarint(b []byte) (uint64, int) {
	v, k := binary.Uvarint(b)
	if k > 0 && k != varintLen(v) {
		return 0, -1
	}
	return v, k
}

func varintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}
