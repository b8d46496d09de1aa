package gossip

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/record"

	"github.com/tribeagent/tribe/internal/edsigner"
)

// Size limits of an entry. They bound what one entry can cost a node that
// stores it; the pubsub validator and the sync protocol reject more.
const (
	MaxKeyLen   = 256
	MaxValueLen = 64 << 10
	// MaxEntrySize bounds a whole signed envelope on the wire.
	MaxEntrySize = MaxValueLen + MaxKeyLen + 1024
)

// Envelope domain and payload type: our own, so a signature made for a
// tribe entry can never be replayed as any other libp2p record, or back.
const envelopeDomain = "tribe-state-entry"

var payloadType = []byte("/tribe/entry/1")

const payloadVersion = 1

var (
	ErrMalformed  = errors.New("gossip: malformed entry")
	ErrBadSigner  = errors.New("gossip: entry not signed by its author")
	ErrTooLarge   = errors.New("gossip: entry over the size limits")
	ErrBadSig     = errors.New("gossip: bad entry signature")
	ErrFromFuture = errors.New("gossip: entry from the future")
	// ErrNotCanonical is an envelope that opens but is not the bytes its
	// fields encode to (see Open); it wraps ErrMalformed.
	ErrNotCanonical = fmt.Errorf("%w: envelope not in its canonical encoding", ErrMalformed)
)

// Entry is one versioned key of the replicated map. Deleted marks a
// tombstone. The version is (HLC, Author): higher wins.
type Entry struct {
	Key     string
	Value   []byte
	HLC     HLC
	Author  peer.ID
	Deleted bool
}

// newer reports whether e's version beats o's: the higher (HLC, author)
// wins, and of two envelopes an author signed with one clock (only that
// author's own doing: a bug, or a peer playing games with its own keys)
// the one with the higher hash, so that every replica keeps the same one
// whichever came first; keeping the first, replicas that saw them in
// different orders never agreed, and every pull between them fetched and
// checked the key again.
func (e *Signed) newer(o *Signed) bool {
	if e.HLC != o.HLC {
		return e.HLC > o.HLC
	}
	if e.Author != o.Author {
		return e.Author > o.Author
	}
	return bytes.Compare(e.Hash[:], o.Hash[:]) > 0
}

// payload is the record.Record that envelopes carry.
type payload struct{ Entry }

func (*payload) Domain() string { return envelopeDomain }
func (*payload) Codec() []byte  { return payloadType }

func (p *payload) MarshalRecord() ([]byte, error) { return encodeEntry(&p.Entry) }

func (p *payload) UnmarshalRecord(b []byte) error {
	e, err := decodeEntry(b)
	if err != nil {
		return err
	}
	p.Entry = e
	return nil
}

// encodeEntry writes version | flags | hlc | key | author | value, with
// uvarint lengths.
func encodeEntry(e *Entry) ([]byte, error) {
	if len(e.Key) == 0 || len(e.Key) > MaxKeyLen || len(e.Value) > MaxValueLen {
		return nil, fmt.Errorf("%w: key %d bytes, value %d bytes", ErrTooLarge, len(e.Key), len(e.Value))
	}
	b := make([]byte, 0, 16+len(e.Key)+len(e.Author)+len(e.Value)+3*binary.MaxVarintLen16)
	var flags byte
	if e.Deleted {
		flags = 1
	}
	b = append(b, payloadVersion, flags)
	b = binary.BigEndian.AppendUint64(b, uint64(e.HLC))
	for _, f := range [][]byte{[]byte(e.Key), []byte(e.Author), e.Value} {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	return b, nil
}

// decodeEntry parses bytes from the network; it never panics and never
// allocates more than its input's size.
func decodeEntry(b []byte) (Entry, error) {
	var e Entry
	if len(b) < 10 {
		return e, fmt.Errorf("%w: %d bytes", ErrMalformed, len(b))
	}
	if b[0] != payloadVersion {
		return e, fmt.Errorf("%w: version %d", ErrMalformed, b[0])
	}
	if b[1]&^1 != 0 {
		return e, fmt.Errorf("%w: unknown flags %#x", ErrMalformed, b[1])
	}
	e.Deleted = b[1] == 1
	e.HLC = HLC(binary.BigEndian.Uint64(b[2:10]))
	rest := b[10:]
	var fields [3][]byte
	for i, limit := range []int{MaxKeyLen, 128, MaxValueLen} {
		n, k := uvarint(rest)
		if k <= 0 || n > uint64(len(rest)-k) {
			return e, fmt.Errorf("%w: truncated field %d", ErrMalformed, i)
		}
		if n > uint64(limit) {
			return e, fmt.Errorf("%w: field %d is %d bytes", ErrTooLarge, i, n)
		}
		fields[i], rest = rest[k:k+int(n)], rest[k+int(n):]
	}
	if len(rest) != 0 {
		return e, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(rest))
	}
	if len(fields[0]) == 0 {
		return e, fmt.Errorf("%w: empty key", ErrMalformed)
	}
	author, err := peer.IDFromBytes(fields[1])
	if err != nil {
		return e, fmt.Errorf("%w: author: %v", ErrMalformed, err)
	}
	e.Key, e.Author = string(fields[0]), author
	if len(fields[2]) > 0 {
		e.Value = append([]byte(nil), fields[2]...)
	}
	return e, nil
}

// Signed is an entry with the envelope that carries it. Raw is what is
// stored and sent; Hash identifies this exact version.
type Signed struct {
	Entry
	Raw  []byte
	Hash [32]byte
}

// Sign seals e, authored by key's peer, into an envelope.
func Sign(e Entry, key crypto.PrivKey) (*Signed, error) {
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("gossip: sign: %w", err)
	}
	e.Author = id
	env, err := record.Seal(&payload{e}, key)
	if err != nil {
		return nil, fmt.Errorf("gossip: sign: %w", err)
	}
	raw, err := env.Marshal()
	if err != nil {
		return nil, fmt.Errorf("gossip: sign: %w", err)
	}
	return &Signed{Entry: e, Raw: raw, Hash: sha256.Sum256(raw)}, nil
}

// Open checks raw's signature and that its signer is the entry's author,
// and returns the entry. It does not authorise: see State.Apply.
func Open(raw []byte) (*Signed, error) {
	if len(raw) > MaxEntrySize {
		return nil, fmt.Errorf("%w: %d bytes", ErrTooLarge, len(raw))
	}
	if _, err := precheck(raw); err != nil {
		return nil, err
	}
	var p payload
	env, err := record.ConsumeTypedEnvelope(raw, &p)
	if err != nil {
		if errors.Is(err, record.ErrInvalidSignature) {
			return nil, fmt.Errorf("%w: %v", ErrBadSig, err)
		}
		if errors.Is(err, ErrTooLarge) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if string(env.PayloadType) != string(payloadType) {
		return nil, fmt.Errorf("%w: payload type %q", ErrMalformed, env.PayloadType)
	}
	return &Signed{Entry: p.Entry, Raw: raw, Hash: sha256.Sum256(raw)}, nil
}

// precheck refuses, before its signature is checked (about 70 µs), an
// entry that no agent could have signed: one signed with a key that is
// not Ed25519 (edsigner), or by another than its author; and one in bytes
// other than those its fields encode to, which anyone could write of
// another's entry, with another hash (which breaks the tie of an author's
// one clock: see newer) and another pubsub message ID. It returns the
// entry as its bytes say, signature unchecked.
func precheck(raw []byte) (Entry, error) {
	env, err := edsigner.Read(raw)
	if err != nil {
		return Entry{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if !env.Canonical {
		return Entry{}, ErrNotCanonical
	}
	var p payload
	if err := p.UnmarshalRecord(env.Payload); errors.Is(err, ErrTooLarge) {
		return Entry{}, err
	} else if err != nil {
		return Entry{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if env.Signer != p.Author {
		return Entry{}, fmt.Errorf("%w: signed by %s, author %s", ErrBadSigner, env.Signer, p.Author)
	}
	return p.Entry, nil
}

// peek is Open without the signature check: the entry as raw says, for
// refusing before the check what would be refused after it whatever the
// signature (see Replica.validate). Nothing it returns may be taken.
func peek(raw []byte) (*Signed, error) {
	if len(raw) > MaxEntrySize {
		return nil, fmt.Errorf("%w: %d bytes", ErrTooLarge, len(raw))
	}
	e, err := precheck(raw)
	if err != nil {
		return nil, err
	}
	return &Signed{Entry: e, Raw: raw, Hash: sha256.Sum256(raw)}, nil
}
