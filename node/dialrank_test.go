package node

import (
	"testing"
	"time"

	ma "github.com/multiformats/go-multiaddr"
)

func TestTCPFirst(t *testing.T) {
	const id = "/p2p/12D3KooWGzxzKZYveHXtpG6AsrUJBcWxHBFS2HsEoGTxrMLvKXtf"
	tests := []struct {
		name  string
		addrs []string
		want  map[string]time.Duration // address → delay
	}{
		{
			name:  "TCP before QUIC",
			addrs: []string{"/ip4/127.0.0.1/udp/4001/quic-v1", "/ip4/127.0.0.1/tcp/4001"},
			want:  map[string]time.Duration{"/ip4/127.0.0.1/tcp/4001": 0, "/ip4/127.0.0.1/udp/4001/quic-v1": tcpFallback},
		},
		{
			name:  "with a peer ID",
			addrs: []string{"/ip4/10.0.0.1/udp/4001/quic-v1" + id, "/ip4/10.0.0.1/tcp/4001" + id},
			want:  map[string]time.Duration{"/ip4/10.0.0.1/tcp/4001" + id: 0, "/ip4/10.0.0.1/udp/4001/quic-v1" + id: tcpFallback},
		},
		{
			name:  "QUIC alone, at once",
			addrs: []string{"/ip4/10.0.0.1/udp/4001/quic-v1"},
			want:  map[string]time.Duration{"/ip4/10.0.0.1/udp/4001/quic-v1": 0},
		},
		{
			name:  "TCP alone",
			addrs: []string{"/ip4/10.0.0.1/tcp/4001"},
			want:  map[string]time.Duration{"/ip4/10.0.0.1/tcp/4001": 0},
		},
		{
			name:  "nothing",
			addrs: nil,
			want:  map[string]time.Duration{},
		},
		{
			name:  "websocket is not plain TCP",
			addrs: []string{"/ip4/10.0.0.1/tcp/4002/ws", "/ip4/10.0.0.1/tcp/4001"},
			want:  map[string]time.Duration{"/ip4/10.0.0.1/tcp/4001": 0, "/ip4/10.0.0.1/tcp/4002/ws": tcpFallback},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var addrs []ma.Multiaddr
			for _, s := range tt.addrs {
				addrs = append(addrs, ma.StringCast(s))
			}
			got := tcpFirst(addrs)
			if len(got) != len(tt.want) {
				t.Fatalf("ranked %d addresses, want %d: %v", len(got), len(tt.want), got)
			}
			for _, r := range got {
				want, ok := tt.want[r.Addr.String()]
				if !ok {
					t.Fatalf("ranked %s, not given", r.Addr)
				}
				if r.Delay != want {
					t.Errorf("%s: delay %v, want %v", r.Addr, r.Delay, want)
				}
			}
		})
	}
}

// A second TCP address waits as the swarm's ranker has it; QUIC waits for
// the last TCP dial.
func TestTCPFirstWaitsForTheLastTCPDial(t *testing.T) {
	addrs := []ma.Multiaddr{
		ma.StringCast("/ip4/10.0.0.1/tcp/4001"),
		ma.StringCast("/ip4/10.0.0.1/tcp/4005"),
		ma.StringCast("/ip4/10.0.0.1/udp/4001/quic-v1"),
	}
	var lastTCP, quic time.Duration
	for _, r := range tcpFirst(addrs) {
		if isTCP(r.Addr) {
			lastTCP = max(lastTCP, r.Delay)
		} else {
			quic = r.Delay
		}
	}
	if lastTCP == 0 {
		t.Fatal("both TCP addresses dialled at once; the swarm's ranker staggers them")
	}
	if quic != lastTCP+tcpFallback {
		t.Errorf("QUIC at %v, want %v after the last TCP dial (%v)", quic, tcpFallback, lastTCP)
	}
}
