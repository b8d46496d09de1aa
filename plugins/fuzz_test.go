package plugins

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"testing"
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
		for range 4 {
			b, err := readFrame(r, 64)
			if err != nil {
				return
			}
			if len(b) > 64 {
				t.Fatalf("frame of %d bytes over the limit", len(b))
			}
		}
	})
}
