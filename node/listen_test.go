package node

import (
	"context"
	"strings"
	"testing"

	ma "github.com/multiformats/go-multiaddr"
)

// listenPorts are the TCP and UDP ports n listens on; it has a TCP one.
func listenPorts(t *testing.T, n *Node) (tcp, udp string) {
	t.Helper()
	for _, a := range n.Host().Network().ListenAddresses() {
		if p, err := a.ValueForProtocol(ma.P_TCP); err == nil {
			tcp = p
		}
		if p, err := a.ValueForProtocol(ma.P_UDP); err == nil {
			udp = p
		}
	}
	if tcp == "" {
		t.Fatalf("no TCP listener: %v", n.Host().Network().ListenAddresses())
	}
	return tcp, udp
}

// TestListenAddressInUseIsRefused: a second agent on a port the first
// listens on must not start. With SO_REUSEPORT it used to share the TCP
// port (the kernel then split inbound connections between two identities:
// "peer id mismatch" on the dialler) and silently drop its QUIC address.
func TestListenAddressInUseIsRefused(t *testing.T) {
	a := startNode(t, loopbackConfig(t, "a"))
	tcpPort, udpPort := listenPorts(t, a)
	if udpPort == "" {
		t.Fatal("a has no QUIC listener")
	}
	for _, tc := range []struct {
		name   string
		listen []string
		busy   string
	}{
		{"both", []string{"/ip4/127.0.0.1/tcp/" + tcpPort, "/ip4/127.0.0.1/udp/" + udpPort + "/quic-v1"}, "/tcp/" + tcpPort},
		{"tcp", []string{"/ip4/127.0.0.1/tcp/" + tcpPort, "/ip4/127.0.0.1/udp/0/quic-v1"}, "/tcp/" + tcpPort},
		{"quic", []string{"/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/" + udpPort + "/quic-v1"}, "/udp/" + udpPort},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := loopbackConfig(t, "b")
			c.ListenAddrs = tc.listen
			b, err := New(c, Deps{})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			err = b.Start(context.Background())
			if err == nil {
				t.Fatalf("second node started on %v, which a listens on", b.Host().Network().ListenAddresses())
			}
			if msg := err.Error(); !strings.Contains(msg, tc.busy) || !strings.Contains(msg, "in use by another process") {
				t.Fatalf("error does not say which address is in use: %v", err)
			}
		})
	}
}
