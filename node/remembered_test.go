package node

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

func newPeerID(t *testing.T) peer.ID {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(k)
	return id
}

func TestRememberedSurvivesReloadAndKeepsNewest(t *testing.T) {
	path := filepath.Join(t.TempDir(), rememberedFile)
	r, err := loadRemembered(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	ids := []peer.ID{newPeerID(t), newPeerID(t), newPeerID(t)}
	addr := []ma.Multiaddr{ma.StringCast("/ip4/127.0.0.1/tcp/4001")}
	for i, id := range ids {
		if !r.seen(id, addr, t0.Add(time.Duration(i)*time.Second)) {
			t.Fatalf("peer %d not reported as new", i)
		}
	}
	if r.seen(ids[2], addr, t0.Add(time.Hour)) {
		t.Fatal("known peer reported as new")
	}
	if err := r.save(); err != nil {
		t.Fatal(err)
	}
	again, err := loadRemembered(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	due := again.due(t0, func(peer.ID) bool { return false })
	if len(due) != 2 || due[0].ID != ids[2] || due[1].ID != ids[1] {
		t.Fatalf("due = %v, want the two newest, newest first", due)
	}
	if len(due[0].Addrs) != 1 {
		t.Fatalf("addresses lost: %v", due[0].Addrs)
	}
	// A failed dial defers the peer; a connected one is never due.
	again.failed(ids[1], t0, func(int) time.Duration { return time.Minute })
	due = again.due(t0.Add(time.Second), func(p peer.ID) bool { return p == ids[2] })
	if len(due) != 0 {
		t.Fatalf("due = %v, want none", due)
	}
}

func TestRememberedCorruptFileIsAWarningNotAFailure(t *testing.T) {
	path := filepath.Join(t.TempDir(), rememberedFile)
	os.WriteFile(path, []byte("{not json"), 0o600)
	r, err := loadRemembered(path, 10)
	if err == nil {
		t.Fatal("corrupt file not reported")
	}
	if r == nil || len(r.peers) != 0 {
		t.Fatal("corrupt file should give an empty, usable set")
	}
}
