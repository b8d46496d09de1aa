package growbuf

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// TestRead: what Read returns and reserves, and that it never holds much
// more than what arrived, whatever length was declared.
func TestRead(t *testing.T) {
	const mib = 1 << 20
	whole := bytes.Repeat([]byte{7}, mib)
	for _, tc := range []struct {
		name  string
		in    io.Reader
		n     int
		limit int
		want  []byte // the message, if it reads
		err   error  // else this error
		peak  int    // the most reserved at once, at most
	}{
		{"nothing declared", bytes.NewReader(nil), 0, mib, nil, nil, 0},
		{"small", bytes.NewReader([]byte("hello, and more")), 5, mib, []byte("hello"), nil, 5},
		{"a MiB, whole", bytes.NewReader(whole), mib, 2 * mib, whole, nil, mib * 3 / 2},
		{"a MiB, a byte at a time", iotest.OneByteReader(bytes.NewReader(whole)), mib, 2 * mib, whole, nil, mib * 3 / 2},
		{"a MiB declared, 3 bytes sent", bytes.NewReader([]byte("abc")), mib, 2 * mib, nil, ErrTruncated, Chunk},
		{"a MiB declared, nothing sent", bytes.NewReader(nil), mib, 2 * mib, nil, ErrTruncated, Chunk},
		{"the stream fails", iotest.ErrReader(errors.New("reset")), 10, mib, nil, ErrTruncated, Chunk},
		{"memory refused", bytes.NewReader(whole), mib, mib / 2, nil, ErrNoMemory, mib / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := &Limit{Max: tc.limit}
			b, held, err := Read(tc.in, tc.n, mem)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				if b != nil || held != 0 || mem.Reserved != 0 {
					t.Fatalf("on error: %d bytes, held %d, %d still reserved", len(b), held, mem.Reserved)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(b, tc.want) {
					t.Fatalf("read %d bytes, want %d", len(b), len(tc.want))
				}
				if held != mem.Reserved || held < len(b) {
					t.Fatalf("held %d for %d bytes, %d reserved", held, len(b), mem.Reserved)
				}
				mem.ReleaseMemory(held)
			}
			if mem.Peak > tc.peak {
				t.Fatalf("reserved up to %d bytes, want at most %d", mem.Peak, tc.peak)
			}
		})
	}
	if _, _, err := Read(bytes.NewReader(nil), 5, nil); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a clean end inside the message: %v, want io.ErrUnexpectedEOF", err)
	}
}
