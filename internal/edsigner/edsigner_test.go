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

// Signer names an Ed25519 signer and the payload without checking the
// signature, and refuses every other key type and bytes that do not read.
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
	if id, payload, err := Signer(seal(ed)); err != nil || id != want || string(payload) != "payload" {
		t.Fatalf("Ed25519: %s %q %v", id, payload, err)
	}
	ec, _, _ := crypto.GenerateECDSAKeyPair(rand.Reader)
	sk, _, _ := crypto.GenerateSecp256k1Key(rand.Reader)
	for name, k := range map[string]crypto.PrivKey{"ECDSA": ec, "secp256k1": sk} {
		if _, _, err := Signer(seal(k)); !errors.Is(err, ErrKeyType) {
			t.Errorf("%s: %v, want ErrKeyType", name, err)
		}
	}
	for _, bad := range [][]byte{nil, []byte("\\xff\\xff"), []byte{0x0a, 0x05, 1, 2}} {
		if _, _, err := Signer(bad); err == nil {
			t.Errorf("%q read", bad)
		}
	}
}
