package gossip

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/internal/growbuf"
)

// FuzzOpen feeds arbitrary bytes to the entry decoder (envelope, payload,
// signature): no panic, and whatever it accepts re-encodes to itself.
func FuzzOpen(f *testing.F) {
	rng := rand.New(rand.NewPCG(9, 9))
	a := newAuthor(f, rng)
	f.Add(a.write(f, t0, "tribes/core", "v", false).Raw)
	f.Add(a.write(f, t0, "nodes/"+a.id.String(), `{"name":"x"}`, true).Raw)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := Open(b)
		if err != nil {
			return
		}
		p, err := encodeEntry(&e.Entry)
		if err != nil {
			t.Fatalf("accepted entry does not re-encode: %v", err)
		}
		back, err := decodeEntry(p)
		if err != nil || back.Key != e.Key || back.HLC != e.HLC || back.Author != e.Author || !bytes.Equal(back.Value, e.Value) {
			t.Fatalf("round trip: %+v vs %+v (%v)", back, e.Entry, err)
		}
	})
}

// FuzzDecodeEntry targets the payload decoder alone, which runs before any
// signature check.
func FuzzDecodeEntry(f *testing.F) {
	rng := rand.New(rand.NewPCG(10, 10))
	a := newAuthor(f, rng)
	p, _ := encodeEntry(&Entry{Key: "tribes/x", Value: []byte("v"), HLC: 5, Author: a.id})
	f.Add(p)
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEntry(b)
		if err != nil {
			return
		}
		again, err := encodeEntry(&e)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("accepted payload does not re-encode to itself: %v", err)
		}
	})
}

// FuzzSyncMessages feeds arbitrary bytes to both sync decoders; accepted
// messages re-encode to the same bytes, and a state can answer any decoded
// request without panicking.
func FuzzSyncMessages(f *testing.F) {
	s := NewState(NewTrust())
	s.SetDirect(DirectKey)
	f.Add(EncodeRequest(SyncRequest{Probes: []Probe{{Node: NodeRef{Depth: 1, Value: 3}, Hash: 9}}, Want: []uint64{1, 2}}))
	f.Add(EncodeResponse(SyncResponse{Nodes: []NodeReply{{Node: NodeRef{}, Children: make([]uint64, 16)}, {Node: NodeRef{Depth: 2, Value: 1}, Items: []ItemSummary{{1, 2}}}}, Served: 1, Entries: [][]byte{[]byte("x")}}))
	f.Add([]byte{'Q', 0, 0})
	f.Add([]byte{'R', 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if req, err := DecodeRequest(b); err == nil {
			if !bytes.Equal(EncodeRequest(req), b) {
				t.Fatal("request does not re-encode to itself")
			}
			CheckRequest(req)
			s.Respond(req, 1<<20, Full)
			s.Respond(req, 1<<20, Shared)
		}
		if resp, err := DecodeResponse(b); err == nil {
			if !bytes.Equal(EncodeResponse(resp), b) {
				t.Fatal("response does not re-encode to itself")
			}
			CheckResponse(SyncRequest{}, resp)
			CheckResponse(SyncRequest{Want: []uint64{1, 2}}, resp)
			s.NextPull(SyncRequest{}, resp, Full, nil)
			s.NextPull(SyncRequest{}, resp, Shared, nil)
		}
	})
}

// FuzzReadMsg feeds arbitrary bytes to the sync stream reader: no panic;
// every message it accepts re-encodes (WriteMsg) to exactly the bytes it
// consumed; what it holds is reserved, exactly the message's size, and
// nothing stays reserved after an error.
func FuzzReadMsg(f *testing.F) {
	f.Add(frameOf([]byte("hello")))
	f.Add(append(frameOf(EncodeRequest(SyncRequest{Want: []uint64{1}})), frameOf(nil)...))
	f.Add(binary.AppendUvarint(nil, MaxSyncMessage))
	f.Add([]byte{0x80, 0x00})
	f.Add(bytes.Repeat([]byte{0xff}, 12))
	f.Fuzz(func(t *testing.T, in []byte) {
		mem := &growbuf.Limit{Max: 1 << 30}
		br := bufio.NewReader(bytes.NewReader(in))
		consumed := 0
		for {
			b, held, err := ReadMsg(br, mem)
			if err != nil {
				if mem.Reserved != 0 {
					t.Fatalf("%d bytes reserved after %v", mem.Reserved, err)
				}
				return
			}
			if held != len(b) || mem.Reserved != held {
				t.Fatalf("a %d-byte message holds %d, %d reserved", len(b), held, mem.Reserved)
			}
			var again bytes.Buffer
			if err := WriteMsg(&again, b); err != nil {
				t.Fatalf("accepted message does not re-encode: %v", err)
			}
			if !bytes.Equal(again.Bytes(), in[consumed:consumed+again.Len()]) {
				t.Fatal("accepted message does not re-encode to the bytes read")
			}
			consumed += again.Len()
			mem.ReleaseMemory(held)
		}
	})
}

// canonicalPeer agrees with decoding and writing the ID back, for any
// string: it accepts exactly the IDs in the form peer.ID.String writes.
func FuzzCanonicalPeer(f *testing.F) {
	id := newAuthor(f, rand.New(rand.NewPCG(9, 9))).id
	f.Add(id.String())
	f.Add(peer.ToCid(id).String())
	f.Add("1" + id.String())
	f.Add(id.String()[:20])
	f.Add("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N")
	f.Add("11111")
	f.Add("1")
	f.Add("Qm")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		want, err := peer.Decode(s)
		ok := err == nil && want.String() == s
		got, gotOK := canonicalPeer(s)
		if gotOK != ok || (ok && got != want) {
			t.Fatalf("canonicalPeer(%q) = %v, %v; decoded and written back: %v, %v", s, got, gotOK, want, ok)
		}
	})
}
