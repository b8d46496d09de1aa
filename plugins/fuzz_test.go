package plugins

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"testing"

	"github.com/tribeagent/tribe/internal/growbuf"
)

// FuzzDecodeRequest: any bytes a caller sends give a checked request or an
// error, never a panic, and a decoded request encodes back to one that
// decodes the same.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"id":"1","tribe":"t","plugin":"echo","method":"echo","args":{"a":1},"deadline":100}`))
	f.Add([]byte(`{"plugin":"exec","method":"run","args":"x"}`))
	f.Add([]byte(`{"plugin":"../x"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := DecodeRequest(b)
		if err != nil {
			return
		}
		if req.Check() != nil {
			t.Fatal("decoded a request that does not check")
		}
		if req.Timeout() <= 0 || req.Timeout() > MaxTimeout {
			t.Fatalf("timeout %v out of bounds", req.Timeout())
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeRequest(again); err != nil {
			t.Fatalf("re-encoded request refused: %v", err)
		}
	})
}

// FuzzDecodeResponse: any bytes a callee answers with give a response or
// an error; a response that is not ok always says why.
func FuzzDecodeResponse(f *testing.F) {
	f.Add([]byte(`{"id":"1","ok":true,"result":[1],"duration":5}`))
	f.Add([]byte(`{"ok":false,"error":"x","code":"busy"}`))
	f.Add([]byte(`{"ok":false}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		resp, err := DecodeResponse(b)
		if err == nil && !resp.OK && resp.Error == "" {
			t.Fatal("not ok without an error")
		}
	})
}

// FuzzReadFrame: a frame reader fed any bytes returns frames within the
// limit or an error, and never allocates beyond the limit.
func FuzzReadFrame(f *testing.F) {
	f.Add(binary.AppendUvarint(nil, 3), []byte("abc"))
	f.Add(binary.AppendUvarint(nil, 1<<40), []byte{})
	f.Add([]byte{0x80, 0x80}, []byte{})
	f.Fuzz(func(t *testing.T, prefix, rest []byte) {
		r := bufio.NewReader(bytes.NewReader(append(prefix, rest...)))
		mem := &growbuf.Limit{Max: 1 << 30}
		for range 4 {
			b, held, err := readFrame(r, 64, mem)
			if err != nil {
				if mem.Reserved != 0 {
					t.Fatalf("%d bytes still reserved after %v", mem.Reserved, err)
				}
				return
			}
			if len(b) > 64 || held < len(b) || held != mem.Reserved {
				t.Fatalf("frame of %d bytes (limit 64), %d held, %d reserved", len(b), held, mem.Reserved)
			}
			mem.ReleaseMemory(held)
		}
	})
}

// TestReadFrameGrowsAsBytesArrive: a frame announced at the largest
// request size whose bytes do not come makes the reader reserve one chunk
// (4 KiB), not the megabyte announced, and leaves nothing reserved; the
// scope refusing is ErrFrameNoMemory; a whole frame is read and held.
func TestReadFrameGrowsAsBytesArrive(t *testing.T) {
	announced := binary.AppendUvarint(nil, MaxRequestSize)
	peak := &growbuf.Limit{Max: 1 << 30}
	_, _, err := readFrame(bufio.NewReader(bytes.NewReader(append(announced, "abc"...))), MaxRequestSize, peak)
	if err == nil || errors.Is(err, ErrFrameTooLarge) || peak.Peak > 4<<10 || peak.Reserved != 0 {
		t.Fatalf("1 MiB announced, 3 bytes sent: err %v, reserved up to %d, %d left", err, peak.Peak, peak.Reserved)
	}
	whole := append(announced, bytes.Repeat([]byte{'x'}, MaxRequestSize)...)
	tight := &growbuf.Limit{Max: 64 << 10}
	if _, _, err := readFrame(bufio.NewReader(bytes.NewReader(whole)), MaxRequestSize, tight); !errors.Is(err, ErrFrameNoMemory) || tight.Reserved != 0 {
		t.Fatalf("a scope of 64 KiB: err %v, %d left reserved", err, tight.Reserved)
	}
	roomy := &growbuf.Limit{Max: 4 << 20}
	b, held, err := readFrame(bufio.NewReader(bytes.NewReader(whole)), MaxRequestSize, roomy)
	if err != nil || len(b) != MaxRequestSize || held != roomy.Reserved || held < len(b) {
		t.Fatalf("a whole frame: %d bytes, held %d, reserved %d, err %v", len(b), held, roomy.Reserved, err)
	}
}
