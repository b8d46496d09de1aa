package node

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/libp2p/go-libp2p/core/network"
	ma "github.com/multiformats/go-multiaddr"
)

// listen opens every listener in addrs, or fails. The swarm's own Listen
// succeeds if any one address does and only logs the others, which left an
// agent running without its QUIC address (its peers then dial an address
// where another agent answers).
func listen(nw network.Network, addrs []ma.Multiaddr) error {
	// The swarm's AddListenAddr returns the transport's error as it is
	// (Listen flattens it to text), so an address in use can be told apart.
	add := nw.Listen
	if sw, ok := nw.(interface{ AddListenAddr(ma.Multiaddr) error }); ok {
		add = func(a ...ma.Multiaddr) error { return sw.AddListenAddr(a[0]) }
	}
	for _, a := range addrs {
		if err := add(a); err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return fmt.Errorf("node: listen on %s: address in use by another process (another agent?); choose another port with --listen: %w", a, err)
			}
			return fmt.Errorf("node: listen on %s: %w", a, err)
		}
	}
	return nil
}
