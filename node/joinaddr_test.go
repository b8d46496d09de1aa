package node

import (
	"strings"
	"testing"
)

func TestParseJoinForms(t *testing.T) {
	const id = "12D3KooWJveGj4FtLxPTCvQzyzUweLC22uto2brEtE4pTkK6xNCj"
	for _, tc := range []struct {
		in, addr, id string
	}{
		{"127.0.0.1:4001", "/ip4/127.0.0.1/tcp/4001", ""},
		{"[::1]:4001", "/ip6/::1/tcp/4001", ""},
		{"host.example:4001", "/dns/host.example/tcp/4001", ""},
		{"localhost:4001", "/dns/localhost/tcp/4001", ""},
		{"/dns4/host.example/tcp/4001", "/dns4/host.example/tcp/4001", ""},
		{"/ip6/::1/tcp/4001", "/ip6/::1/tcp/4001", ""},
		{"/ip4/10.0.0.1/tcp/4001/p2p/" + id, "/ip4/10.0.0.1/tcp/4001", id},
		{"/ip4/10.0.0.1/udp/4001/quic-v1/p2p/" + id, "/ip4/10.0.0.1/udp/4001/quic-v1", id},
	} {
		j, err := parseJoin(tc.in)
		if err != nil {
			t.Errorf("parseJoin(%q): %v", tc.in, err)
			continue
		}
		if j.addr.String() != tc.addr || j.id.String() != tc.id || j.given != tc.in {
			t.Errorf("parseJoin(%q) = %v %q, want %s %q", tc.in, j.addr, j.id, tc.addr, tc.id)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"host.example", "missing port"},
		{":4001", "neither an IP address nor a DNS name"},
		{"a..b:4001", "neither an IP address nor a DNS name"},
		{"-a.example:4001", "neither an IP address nor a DNS name"},
		{"host:0", "1 to 65535"},
		{"host:http", "1 to 65535"},
		{"/ip4/10.0.0.1/udp/4001/quic-v1", "only a TCP address"},
		{"/ip4/10.0.0.1/tcp/4001/ws", "only a TCP address"},
		{"/ip4/10.0.0.1", "only a TCP address"},
		{"/nonsense", "join address"},
	} {
		_, err := parseJoin(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseJoin(%q) = %v, want an error mentioning %q", tc.in, err, tc.want)
		}
	}
}
