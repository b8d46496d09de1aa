package edsigner

import (
	"crypto/rand"
	"errors"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/record"
)

type rec struct{ b []byte }

func (*rec) Domain() string                   { return "edsigner-test" }
func (*rec) Codec() []byte                    { return []byte("/edsigner/test") }
func (r *rec) MarshalRecord() ([]byte, error) { return r.b, nil }
func (r *rec) UnmarshalRecord(b []byte) error { r.b = b; return nil }

// Read names an Ed25519 signer and the payload without checking the
// signature, says whether the bytes are the envelope's own, and refuses
// every other key type and bytes that do not read.
func TestSigner(t *testing.T) {
	seal := func(k crypto.PrivKey) []byte {
		env, err := record.Seal(&rec{b: []byte("payload")}, k)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := env.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	ed, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	want, _ := peer.IDFromPrivateKey(ed)
	raw := seal(ed)
	if env, err := Read(raw); err != nil || env.Signer != want || string(env.Payload) != "payload" || !env.Canonical {
		t.Fatalf("Ed25519: %+v %v", env, err)
	}
	// Other bytes of the same envelope: an unknown field after it.
	if env, err := Read(append(raw, 9<<3|2, 1, 'x')); err != nil || env.Canonical {
		t.Fatalf("padded: %+v %v, want read, not canonical", env, err)
	}
	ec, _, _ := crypto.GenerateECDSAKeyPair(rand.Reader)
	sk, _, _ := crypto.GenerateSecp256k1Key(rand.Reader)
	for name, k := range map[string]crypto.PrivKey{"ECDSA": ec, "secp256k1": sk} {
		if _, err := Read(seal(k)); !errors.Is(err, ErrKeyType) {
			t.Errorf("%s: %v, want ErrKeyType", name, err)
		}
	}
	for _, bad := range [][]byte{nil, []byte("\\xff\\xff"), []byte{0x0a, 0x05, 1, 2}} {
		if _, err := Read(bad); err == nil {
			t.Errorf("%q read", bad)
		}
	}
}
