// Package edsigner reads who signed a libp2p signed envelope without
// checking the signature, and refuses any key but Ed25519: every agent's
// identity is an Ed25519 key (keys.LoadOrCreateIdentity), so an envelope
// signed with another never came from one, and is refused before the
// signature check it would cost (an RSA key of up to 8,192 bits costs far
// more to check; ECDSA signatures anyone may vary, making new bytes of
// one signed thing).
package edsigner

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/crypto"
	cryptopb "github.com/libp2p/go-libp2p/core/crypto/pb"
	"github.com/libp2p/go-libp2p/core/peer"
	recordpb "github.com/libp2p/go-libp2p/core/record/pb"
	"google.golang.org/protobuf/proto"
)

// ErrKeyType is the error of an envelope signed with a key that is not
// Ed25519.
var ErrKeyType = errors.New("not signed with an Ed25519 key")

// Envelope is what a signed envelope says, its signature not checked.
type Envelope struct {
	Signer  peer.ID
	Payload []byte
	// Canonical: the envelope's bytes are exactly those its fields
	// encode to, as record.Seal writes them. The signature covers the
	// payload, not the bytes, and protobuf takes unknown fields and a
	// field given twice: anyone may write other bytes of one signed
	// thing.
	Canonical bool
}

// Read reads envelope raw. The error is ErrKeyType for a key that is not
// Ed25519, or says why raw does not read.
func Read(raw []byte) (Envelope, error) {
	var env recordpb.Envelope
	if err := proto.Unmarshal(raw, &env); err != nil {
		return Envelope{}, err
	}
	pk := env.GetPublicKey()
	if t := pk.GetType(); t != cryptopb.KeyType_Ed25519 {
		return Envelope{}, fmt.Errorf("%w: a %v key", ErrKeyType, t)
	}
	key, err := crypto.PublicKeyFromProto(pk)
	if err != nil {
		return Envelope{}, err
	}
	id, err := peer.IDFromPublicKey(key)
	if err != nil {
		return Envelope{}, err
	}
	// As record's Envelope.Marshal writes it, from the known fields.
	canon, err := proto.Marshal(&recordpb.Envelope{
		PublicKey:   &cryptopb.PublicKey{Type: pk.Type, Data: pk.Data},
		PayloadType: env.PayloadType,
		Payload:     env.Payload,
		Signature:   env.Signature,
	})
	return Envelope{Signer: id, Payload: env.Payload, Canonical: err == nil && bytes.Equal(canon, raw)}, nil
}
