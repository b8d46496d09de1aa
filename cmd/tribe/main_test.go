package main

import (
	"io"
	"slices"
	"testing"
)

func TestInterspersedMovesCommandFlagsFirst(t *testing.T) {
	app := newApp(io.Discard, io.Discard)
	cases := []struct{ in, want []string }{
		{[]string{"tribe", "show", "core", "--json"}, []string{"tribe", "show", "--json", "core"}},
		{[]string{"tribe", "--data-dir", "/d", "join", "core", "n1", "--data-dir", "/e", "n2"},
			[]string{"tribe", "--data-dir", "/d", "join", "--data-dir", "/e", "core", "n1", "n2"}},
		{[]string{"tribe", "join", "core", "--", "--json"}, []string{"tribe", "join", "core", "--", "--json"}},
		{[]string{"tribe", "agent", "--listen", "/ip4/1.2.3.4/tcp/1", "--no-mdns"}, []string{"tribe", "agent", "--listen", "/ip4/1.2.3.4/tcp/1", "--no-mdns"}},
		{[]string{"tribe", "peers", "x", "--bogus"}, []string{"tribe", "peers", "--bogus", "x"}},
		{[]string{"tribe", "frob", "--json"}, []string{"tribe", "frob", "--json"}},
		{[]string{"tribe"}, []string{"tribe"}},
	}
	for _, tc := range cases {
		if got := interspersed(app, tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("interspersed(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
