// Package edsigner reads who signed a libp2p signed envelope without
// checking the signature, and refuses any key but Ed25519: every agent's
// identity is an Ed25519 key (keys.LoadOrCreateIdentity), so an envelope
// signed with another never came from one, and is refused before the
// signature check it would cost (an RSA key of up to 8,192 bits costs far
// more to check; ECDSA signatures anyone may vary, making new bytes of
// one signed thing).
package edsigner

import (
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

// Signer returns the peer whose key signed envelope raw, and its payload,
// as the envelope says: the signature is not checked. The error is
// ErrKeyType for a key that is not Ed25519, or says why raw does not read.
func Signer(raw []byte) (peer.ID, []byte, error) {
	var env recordpb.Envelope
	if err := proto.Unmarshal(raw, &env); err != nil {
		return "", nil, err
	}
	if t := env.GetPublicKey().GetType(); t != cryptopb.KeyType_Ed25519 {
		return "", nil, fmt.Errorf("%w: a %v key", ErrKeyType, t)
	}
	key, err := crypto.PublicKeyFromProto(env.GetPublicKey())
	if err != nil {
		return "", nil, err
	}
	id, err := peer.IDFromPublicKey(key)
	if err != nil {
		return "", nil, err
	}
	return id, env.GetPayload(), nil
}
