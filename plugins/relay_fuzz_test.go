package plugins

import (
	"crypto/ed25519"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// fuzzKey is a fixed identity for seeds.
func fuzzKey(f *testing.F, seed byte) (crypto.PrivKey, peer.ID) {
	f.Helper()
	k, _, err := crypto.KeyPairFromStdKey(ptr(ed25519.NewKeyFromSeed(make32(seed))))
	if err != nil {
		f.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(k)
	return k, id
}

func make32(b byte) []byte {
	s := make([]byte, 32)
	s[0] = b
	return s
}

func ptr[T any](v T) *T { return &v }

// FuzzOpenOrder: any bytes either open as an order that passes its own
// checks, signed by the peer reported, or are refused as a bad order.
func FuzzOpenOrder(f *testing.F) {
	k, id := fuzzKey(f, 1)
	b, err := SealOrder(&Order{ID: "x", Plugin: "echo", Method: "echo", Deadline: 1, Targets: []OrderTarget{{Node: id, Tribe: "t"}}}, k)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte{})
	f.Add(b[:len(b)/2])
	f.Fuzz(func(t *testing.T, b []byte) {
		o, signer, err := OpenOrder(b)
		if err != nil {
			return
		}
		if o.Check() != nil || signer.Validate() != nil {
			t.Fatalf("opened a bad order: %+v by %q", o, signer)
		}
	})
}

// FuzzOpenAnswer: any bytes either open as an answer that names its order
// and says why it is not ok, or are refused.
func FuzzOpenAnswer(f *testing.F) {
	k, id := fuzzKey(f, 2)
	ok, _ := SealAnswer(&Answer{Order: "x", Caller: id, Response: Response{ID: "x", OK: true}}, k)
	bad, _ := SealAnswer(&Answer{Order: "x", Caller: id, Response: Response{ID: "x", Code: CodeBusy, Error: "busy"}}, k)
	f.Add(ok)
	f.Add(bad)
	f.Add([]byte{0x0a})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, _, err := OpenAnswer(b)
		if err != nil {
			return
		}
		if a.Order == "" || a.Response.ID != a.Order || (!a.Response.OK && (a.Response.Error == "" || !a.Response.Code.Known())) {
			t.Fatalf("opened a bad answer: %+v", a)
		}
	})
}

// FuzzRelayedFrame: whatever a relay sends back is either an outcome for a
// target still waited for or a protocol error.
func FuzzRelayedFrame(f *testing.F) {
	k, id := fuzzKey(f, 3)
	_, other := fuzzKey(f, 4)
	o := &Order{ID: "x", Plugin: "echo", Method: "echo", Deadline: 1, Targets: []OrderTarget{{Node: id}}}
	a, _ := sealAnswerFrame(&Answer{Order: "x", Caller: other, Response: Response{ID: "x", OK: true}}, k)
	f.Add(a)
	f.Add(noteFrame(Note{Node: id, Code: CodeUnreachable, Error: "no route"}))
	f.Add([]byte("n{}"))
	f.Add([]byte("z"))
	h := &Caller{host: nil}
	f.Fuzz(func(t *testing.T, b []byte) {
		kind, body, err := splitFrame(b)
		if err != nil || kind != FrameNote {
			// Answers need the caller's own ID (a host): the
			// answer's codec is FuzzOpenAnswer's.
			return
		}
		n, err := DecodeNote(body)
		if err != nil {
			return
		}
		oc, err := h.relayed(b, o, map[peer.ID]bool{id: true})
		if err == nil && (oc.Node != id || n.Node != id || oc.Response.OK) {
			t.Fatalf("an outcome for %s: %+v", oc.Node, oc)
		}
	})
}
