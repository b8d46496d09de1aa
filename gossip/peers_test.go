package gossip

import (
	"crypto/rand"
	"fmt"
	"net"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	ma "github.com/multiformats/go-multiaddr"
)

// genPeer is mn.GenPeer with an Ed25519 identity, as every agent has:
// mocknet makes ECDSA ones, whose entries Open refuses.
func genPeer(mn mocknet.Mocknet) (host.Host, error) {
	sk, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, err
	}
	id, err := peer.IDFromPrivateKey(sk)
	if err != nil {
		return nil, err
	}
	// An address of its own in the discard prefix, as mocknet's.
	ip := net.ParseIP("100::")
	suffix := []byte(id)[len(id)-8:]
	copy(ip[net.IPv6len-len(suffix):], suffix)
	a, err := ma.NewMultiaddr(fmt.Sprintf("/ip6/%s/tcp/4242", ip))
	if err != nil {
		return nil, err
	}
	return mn.AddPeer(sk, a)
}
