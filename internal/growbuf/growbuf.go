// Package growbuf reads a message whose length a peer declared into a
// buffer that grows as its bytes arrive, reserving each growth on a memory
// scope first.
//
// Allocating the declared length up front lets a peer make this node hold
// megabytes for the price of a length prefix: a few bytes per stream,
// times every stream the limits allow it. Read starts at Chunk and doubles
// as bytes come, so holding memory costs the peer sending as much.
package growbuf

import (
	"errors"
	"fmt"
	"io"

	"github.com/libp2p/go-libp2p/core/network"
)

// Memory is what Read reserves a buffer on before growing it.
// network.ResourceScope has these methods: a stream passes its scope, so
// the resource manager's limits (system, protocol, peer) cover message
// buffers as they do libp2p's own.
type Memory interface {
	ReserveMemory(size int, prio uint8) error
	ReleaseMemory(size int)
}

// None accounts nothing.
type None struct{}

func (None) ReserveMemory(int, uint8) error { return nil }
func (None) ReleaseMemory(int)              {}

var (
	// ErrTruncated is a message whose stream ended or failed before its
	// last byte.
	ErrTruncated = errors.New("message cut short")
	// ErrNoMemory is a message the memory scope would not hold.
	ErrNoMemory = errors.New("no memory for the message")
)

// Chunk is the buffer a message starts with.
const Chunk = 4 << 10

// Read reads a message of n bytes from r. Every growth of its buffer is
// reserved on mem first (at network.ReservationPriorityMedium: refused
// once the scope is 60% used, leaving room for libp2p's own needs); mem
// nil accounts nothing. held is what stays reserved for the returned
// message: the caller releases it with mem.ReleaseMemory(held) once done
// with b. On error nothing stays reserved, and the error wraps
// ErrTruncated (and the stream's error, io.ErrUnexpectedEOF for a clean
// end) or ErrNoMemory (and the scope's).
func Read(r io.Reader, n int, mem Memory) (b []byte, held int, err error) {
	if mem == nil {
		mem = None{}
	}
	defer func() {
		if err != nil {
			mem.ReleaseMemory(held)
			b, held = nil, 0
		}
	}()
	for len(b) < n {
		if len(b) == cap(b) {
			size := min(n, max(Chunk, 2*cap(b)))
			if err := mem.ReserveMemory(size, network.ReservationPriorityMedium); err != nil {
				return nil, held, fmt.Errorf("%w: %d bytes of a %d-byte message: %w", ErrNoMemory, size, n, err)
			}
			grown := make([]byte, len(b), size)
			copy(grown, b)
			mem.ReleaseMemory(held)
			b, held = grown, size
		}
		k, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+k]
		if err != nil && len(b) < n {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, held, fmt.Errorf("%w: %d of %d bytes: %w", ErrTruncated, len(b), n, err)
		}
	}
	return b, held, nil
}

// Limit is a Memory of its own, for a reader with no resource manager
// and for tests: at most Max bytes reserved at once, with what is reserved
// now and the most ever.
type Limit struct{ Max, Reserved, Peak int }

func (l *Limit) ReserveMemory(size int, _ uint8) error {
	if l.Reserved+size > l.Max {
		return fmt.Errorf("growbuf: %d bytes more would pass the limit of %d", size, l.Max)
	}
	l.Reserved += size
	l.Peak = max(l.Peak, l.Reserved)
	return nil
}

// ReleaseMemory panics if more is released than was reserved: a
// caller's bug, as sync.WaitGroup's negative count.
func (l *Limit) ReleaseMemory(size int) {
	if l.Reserved -= size; l.Reserved < 0 {
		panic("growbuf: released more than reserved")
	}
}
