package node

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/gossip/authority"
	"github.com/tribeagent/tribe/node/api"
)

// madeUpRecord is the record rec of a node that exists only as a fresh
// key, as anyone can make, signed as written at: its ID, key and entry.
func madeUpRecord(t testing.TB, rec map[string]any, at time.Time) (peer.ID, crypto.PrivKey, *gossip.Signed) {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(key)
	v, _ := json.Marshal(rec)
	s, err := gossip.Sign(gossip.Entry{Key: nodesPrefix + id.String(), Value: v, HLC: gossip.Next(0, at)}, key)
	if err != nil {
		t.Fatal(err)
	}
	return id, key, s
}

// Records of nodes that do not count are bounded, and anyone can fill the
// bound with made-up nodes: a new host's record is then refused
// everywhere, so it cannot be admitted by name. Admitted ahead by its peer
// ID under a name, it counts from its first record, flood or not; and a
// peer ID is known before the host first starts (Identity).
func TestAdmitAheadOfTheRecord(t *testing.T) {
	admin, ca := trustedAdmin(t)
	ctx := context.Background()
	flood := make([]*gossip.Signed, 0, gossip.MaxPending)
	for i := range gossip.MaxPending {
		id, _, s := madeUpRecord(t, map[string]any{"name": fmt.Sprintf("fake%d", i)}, time.Now())
		e, err := admin.replica.Check(id, s.Raw)
		if err != nil {
			t.Fatalf("made-up record %d: %v", i, err)
		}
		flood = append(flood, e)
	}
	if err := admin.replica.Apply(flood...); err != nil {
		t.Fatal(err)
	}
	stranger, _, s := madeUpRecord(t, map[string]any{"name": "late"}, time.Now())
	if _, err := admin.replica.Accept(stranger, s.Raw); !errors.Is(err, gossip.ErrPendingFull) {
		t.Fatalf("a record past the flood: %v, want ErrPendingFull", err)
	}

	cb := loopbackConfig(t, "web-7")
	cb.Trusted, cb.Join = ca.Trusted, []string{tcpAddr(admin)}
	id, created, err := Identity(cb.DataDir)
	if err != nil || !created {
		t.Fatalf("Identity of a new data dir: %v, created %v", err, created)
	}
	if again, created, err := Identity(cb.DataDir); err != nil || created || again != id {
		t.Fatalf("Identity again: %s (want %s), created %v, %v", again, id, created, err)
	}
	// A key in a dir others can write may be theirs: no ID is read from it.
	if err := os.Chmod(cb.DataDir, 0o777); err != nil {
		t.Fatal(err)
	}
	if got, _, err := Identity(cb.DataDir); err == nil {
		t.Fatalf("Identity of a dir anyone can write: %s, no error", got)
	}
	if err := os.Chmod(cb.DataDir, 0o700); err != nil {
		t.Fatal(err)
	}

	for _, bad := range []api.AdmitRequest{
		{Nodes: []string{id.String()}},                                // no record, no name
		{Nodes: []string{"web-7"}, Name: "web-7"},                     // a name, not a peer ID
		{Nodes: []string{id.String(), stranger.String()}, Name: "w"},  // two nodes, one name
		{AllPending: true, Name: "web-7"},                             // every pending node, one name
		{Nodes: []string{id.String()}, Name: "web\x1b]0;owned\x07"},   // a name no record may carry
		{Nodes: []string{id.String()}, Name: strings.Repeat("w", 65)}, // too long
	} {
		if _, err := admin.Admit(ctx, bad); err == nil {
			t.Fatalf("Admit(%+v): no error", bad)
		}
	}
	if got := admin.replica.Prefix(authority.AdmittedPrefix); len(got) != 0 {
		t.Fatalf("refused admissions wrote %d entries", len(got))
	}
	if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{id.String()}}); err == nil || !strings.Contains(err.Error(), "--name NAME") {
		t.Fatalf("admitting a node with no record by peer ID alone: %v, want the hint to name it", err)
	}

	res, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{id.String()}, Name: "web-7"})
	if err != nil || len(res) != 1 || res[0].ID != id.String() || res[0].Name != "web-7" || res[0].Admission != string(authority.Admitted) {
		t.Fatalf("admit ahead: %+v, %v", res, err)
	}
	if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{stranger.String()}, Name: "web-7"}); err == nil || !strings.Contains(err.Error(), "held by node "+id.String()) {
		t.Fatalf("another node ahead under a held name: %v", err)
	}

	b := startNode(t, cb)
	waitFor(t, "admin to hold web-7's record though made-up records fill the bound", func() bool {
		_, ok := admin.nodeNamed(id)
		return ok
	})
	rules := admin.rules()
	if st := rules.Status(id); st != authority.Admitted {
		t.Fatalf("web-7 on admin: %s", st)
	}
	if got := admin.named(rules, "web-7"); !slices.Equal(got, []peer.ID{id}) {
		t.Fatalf("web-7 names %v on admin", got)
	}
	waitFor(t, "web-7 to see itself admitted", func() bool { return b.rules().Status(b.ID()) == authority.Admitted })
	if got := admin.replica.Rejected()["pending_full"]; got != 1 {
		t.Fatalf("pending_full %d: web-7's record was refused, or the flood's were", got)
	}
}
