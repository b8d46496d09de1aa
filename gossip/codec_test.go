package gossip

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/tribeagent/tribe/internal/growbuf"
)

// frameOf is a whole message: the length prefix and body.
func frameOf(body []byte) []byte {
	return append(binary.AppendUvarint(nil, uint64(len(body))), body...)
}

// TestReadMsg: what ReadMsg returns and reserves for every kind of input,
// and that it never holds more than what arrived (at least readChunk).
func TestReadMsg(t *testing.T) {
	big := bytes.Repeat([]byte{7}, MaxSyncMessage)
	for _, tc := range []struct {
		name  string
		in    []byte
		limit int
		want  []byte // the message, if it reads
		err   error  // else this error
		peak  int    // the most reserved at once, at most
	}{
		{"empty message", frameOf(nil), 1 << 30, nil, nil, 0},
		{"small message", frameOf([]byte("hello")), 1 << 30, []byte("hello"), nil, 5},
		{"largest message", frameOf(big), 1 << 30, big, nil, MaxSyncMessage * 3 / 2},
		{"nothing at all", nil, 1 << 30, nil, io.EOF, 0},
		{"4 MiB declared, 3 bytes sent", append(binary.AppendUvarint(nil, MaxSyncMessage), "abc"...), 1 << 30, nil, ErrSyncTruncated, readChunk},
		{"cut in the length", []byte{0x80}, 1 << 30, nil, ErrSyncTruncated, 0},
		{"one byte over the limit", binary.AppendUvarint(nil, MaxSyncMessage+1), 1 << 30, nil, ErrBadSyncMessage, 0},
		{"ten-byte length", bytes.Repeat([]byte{0xff}, 10), 1 << 30, nil, ErrBadSyncMessage, 0},
		{"length not in its shortest form", []byte{0x85, 0x00, 1, 2, 3, 4, 5}, 1 << 30, nil, ErrBadSyncMessage, 0},
		{"zero not in its shortest form", []byte{0x80, 0x80, 0x80, 0x00}, 1 << 30, nil, ErrBadSyncMessage, 0},
		{"memory refused", frameOf(big), 1 << 20, nil, ErrSyncNoMemory, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := &growbuf.Limit{Max: tc.limit}
			b, held, err := ReadMsg(bufio.NewReader(bytes.NewReader(tc.in)), mem)
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
				if held != cap(b) || mem.Reserved != held {
					t.Fatalf("held %d, reserved %d, buffer of %d", held, mem.Reserved, cap(b))
				}
			}
			if mem.Peak > tc.peak {
				t.Fatalf("reserved up to %d bytes, want at most %d", mem.Peak, tc.peak)
			}
		})
	}
}

// TestReadMsgStream: consecutive messages read back as written, and the
// stream's clean end after the last is io.EOF as is.
func TestReadMsgStream(t *testing.T) {
	var buf bytes.Buffer
	msgs := [][]byte{[]byte("a"), nil, bytes.Repeat([]byte("b"), 3*readChunk+1)}
	for _, m := range msgs {
		if err := WriteMsg(&buf, m); err != nil {
			t.Fatal(err)
		}
	}
	br := bufio.NewReader(&buf)
	for i, m := range msgs {
		b, _, err := ReadMsg(br, nil)
		if err != nil || !bytes.Equal(b, m) {
			t.Fatalf("message %d: %d bytes, %v", i, len(b), err)
		}
	}
	if _, _, err := ReadMsg(br, nil); err != io.EOF {
		t.Fatalf("after the last message: %v, want io.EOF", err)
	}
}
