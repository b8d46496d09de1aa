package node

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

func TestLivenessRule(t *testing.T) {
	now := time.Unix(10000, 0)
	const timeout = 30 * time.Second
	cases := []struct {
		name      string
		connected bool
		heard     time.Time
		want      string
	}{
		{"connected, never heard", true, time.Time{}, Alive},
		{"connected, long silent", true, now.Add(-time.Hour), Alive},
		{"heard just now", false, now, Alive},
		{"heard at the timeout", false, now.Add(-timeout), Alive},
		{"silent past the timeout", false, now.Add(-timeout - time.Second), Suspect},
		{"silent at twice the timeout", false, now.Add(-2 * timeout), Suspect},
		{"silent past twice the timeout", false, now.Add(-2*timeout - time.Second), Dead},
		{"never heard, not connected", false, time.Time{}, Dead},
	}
	for _, tc := range cases {
		if got := liveness(tc.connected, tc.heard, now, timeout); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestPresenceRoundTripAndForgery(t *testing.T) {
	k, _, _ := crypto.GenerateEd25519Key(nil)
	id, _ := peer.IDFromPrivateKey(k)
	now := time.UnixMilli(1_800_000_000_000)
	b, err := sealPresence(k, now)
	if err != nil {
		t.Fatal(err)
	}
	got, at, err := openPresence(b)
	if err != nil || got != id || !at.Equal(now) {
		t.Fatalf("open: %v %v %v", got, at, err)
	}
	bad := bytes.Clone(b)
	bad[len(bad)-3] ^= 1
	if _, _, err := openPresence(bad); !errors.Is(err, ErrBadPresence) {
		t.Fatalf("tampered: %v", err)
	}
	if _, _, err := openPresence(make([]byte, 600)); !errors.Is(err, ErrBadPresence) {
		t.Fatalf("oversized: %v", err)
	}
}

// FuzzOpenPresence: presence bytes come from the network.
func FuzzOpenPresence(f *testing.F) {
	k, _, _ := crypto.GenerateEd25519Key(nil)
	b, _ := sealPresence(k, time.UnixMilli(1_800_000_000_000))
	f.Add(b)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, _, err := openPresence(b)
		if err == nil && id == "" {
			t.Fatal("accepted presence without a sender")
		}
	})
}

// Replayed and stale presence messages keep nobody alive, and are counted.
func TestPresenceReplaysAreRefused(t *testing.T) {
	n := startNode(t, loopbackConfig(t, "n"))
	key, _, _ := crypto.GenerateEd25519Key(nil)
	id, _ := peer.IDFromPrivateKey(key)
	now := n.now()
	fresh, _ := sealPresence(key, now)
	if err := n.acceptPresence(fresh); err != nil {
		t.Fatalf("a fresh message: %v", err)
	}
	heard := n.presence.last(id)
	for name, b := range map[string][]byte{
		"the same message again": fresh,
		"an older one":           must(sealPresence(key, now.Add(-time.Second))),
		"an hour old":            must(sealPresence(key, now.Add(-time.Hour))),
		"from the future":        must(sealPresence(key, now.Add(time.Hour))),
	} {
		if err := n.acceptPresence(b); !errors.Is(err, ErrBadPresence) {
			t.Errorf("%s: %v, want ErrBadPresence", name, err)
		}
	}
	if n.presence.last(id) != heard {
		t.Fatal("a refused message moved the time the node was heard")
	}
	if st, _ := n.Status(context.Background()); st.Rejected["bad_presence"] != 4 {
		t.Fatalf("bad_presence = %d, want 4", st.Rejected["bad_presence"])
	}
	if err := n.acceptPresence(must(sealPresence(key, now.Add(time.Second)))); err != nil {
		t.Fatalf("the next message: %v", err)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
