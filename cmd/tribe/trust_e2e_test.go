package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins"
)

// With --trusted, a new agent is pending until a trusted writer admits it:
// it can neither call nor be called, and its policy memberships count for
// nothing. After `tribe admit` it does what the plugin's grant allows. A
// rogue peer that writes a membership for a policy that does not exist
// gains nothing and is counted.
func TestAdmissionAndGrantsEndToEnd(t *testing.T) {
	admin := newAgent(t, "admin")
	adminID := presetIdentity(t, admin)
	admin.args = append(admin.args, "--trusted", adminID)
	admin.start()
	seed := admin.tcpJoin()
	n1 := newAgent(t, "n1", "--join", seed, "--trusted", adminID, "--fact", "role=db")
	n2 := newAgent(t, "n2", "--join", seed, "--trusted", adminID, "--fact", "role=db")
	n1.start()
	n2.start()
	n1ID, n2ID := n1.status().ID, n2.status().ID
	waitUntil(t, 60*time.Second, "admin to see n1 and n2 pending", func() bool {
		var ns []api.Node
		admin.cliJSON(&ns, "nodes", "--pending")
		return len(ns) == 2
	})
	if st := n1.status(); st.Admission != "pending" {
		t.Fatalf("n1 says it is %q", st.Admission)
	}
	if out, _, _ := tribe("status", "--data-dir", admin.dir); !strings.Contains(out, "2 nodes wait for admission") {
		t.Fatalf("admin's status does not say who waits:\n%s", out)
	}
	for _, args := range [][]string{
		{"policy", "create", "db", "--tribe", "db", `facts.role == "db"`},
		{"plugin", "load", "echo", "--tribe", "db", "--callers", "members"},
	} {
		if _, stderr, code := tribe(append(args, "--data-dir", admin.dir)...); code != 0 {
			t.Fatalf("tribe %v: %s", args, stderr)
		}
	}
	if _, stderr, code := tribe("plugin", "load", "echo", "--tribe", "db", "--callers", "all", "--data-dir", admin.dir); code != 1 || !strings.Contains(stderr, "tribe:NAME") {
		t.Fatalf("a bad grant: exit %d %q", code, stderr)
	}

	// Admit n2 only: it is db's one member.
	if out, stderr, code := tribe("admit", "n2", "--data-dir", admin.dir); code != 0 || !strings.Contains(out, "admitted") {
		t.Fatalf("admit n2: exit %d %s%s", code, out, stderr)
	}
	waitUntil(t, 60*time.Second, "n2 alone in db, echo loaded, as n1 sees it", func() bool {
		var tr api.Tribe
		if _, _, code := tribe("show", "db", "--data-dir", n1.dir); code != 0 {
			return false
		}
		n1.cliJSON(&tr, "show", "db")
		var ps []api.Plugin
		n1.cliJSON(&ps, "plugin", "list", "--tribe", "db")
		return len(tr.Members) == 1 && tr.Members[0].Name == "n2" && len(ps) == 1 &&
			len(ps[0].Nodes) == 1 && ps[0].Nodes[0].State == "loaded"
	})
	// Pending n1 cannot call n2...
	got, _, code := callLines(t, n1, "--node", n2ID, "echo", "echo", `{"x":1}`)
	if code != 1 || got["n2"].Code != "unauthorized" || !strings.Contains(got["n2"].Error, "pending") {
		t.Fatalf("pending n1 -> n2: exit %d %+v", code, got)
	}
	// ...nor be called: no caller targets it, and it runs no tribe's
	// plugins.
	if _, stderr, code := tribe("call", "--node", n1ID, "echo", "echo", "--data-dir", admin.dir); code != 1 || !strings.Contains(stderr, "pending") {
		t.Fatalf("admin -> pending n1: exit %d %q", code, stderr)
	}
	var n1Plugins []api.Plugin
	n1.cliJSON(&n1Plugins, "plugin", "list", "--tribe", "db")
	if len(n1Plugins) != 1 || len(n1Plugins[0].Nodes) != 1 || n1Plugins[0].Nodes[0].Name != "n2" {
		t.Fatalf("pending n1 sees db's echo on %+v, want on n2 alone", n1Plugins)
	}

	// Admitted, n1 joins db by the policy and may call its members.
	if _, stderr, code := tribe("admit", n1ID, "--data-dir", admin.dir); code != 0 {
		t.Fatalf("admit n1: %s", stderr)
	}
	waitUntil(t, 60*time.Second, "n1 and n2 in db with echo loaded", func() bool {
		return n1.loadedIn("db") == 2
	})
	got, stderr, code := callLines(t, n1, "--tribe", "db", "echo", "echo", `{"x":1}`)
	if code != 0 || !got["n1"].OK || !got["n2"].OK || string(got["n2"].Result) != `{"x":1}` {
		t.Fatalf("admitted member n1 -> db: exit %d %+v\n%s", code, got, stderr)
	}

	// A rogue peer with a fresh identity writes the kinds of entry it
	// may sign: its own record (claiming n2's name), which n2 holds as a
	// pending node's, and its own membership of db, by a policy that
	// does not exist, which n2 refuses (it counts for nobody).
	rogue := newRogue(t, n2.tcpJoin())
	rogue.publish(t, "nodes/"+rogue.id.String(), `{"name":"n2","addrs":[],"version":"x"}`)
	rogue.publish(t, "tribes/db/members/"+rogue.id.String()+"/policy", `{"policies":["no-such-policy"]}`)
	waitUntil(t, 30*time.Second, "n2 to count the rogue's membership and name claim", func() bool {
		st := n2.status()
		return st.Rejected["not_admitted"] >= 1 && st.Pending == 1
	})
	var members []api.Member
	n2.cliJSON(&members, "members", "db")
	if len(members) != 2 {
		t.Fatalf("db's members with the rogue about: %+v", members)
	}
	// n2's name still means n2.
	got, _, code = callLines(t, admin, "--node", "n2", "echo", "echo")
	if code != 0 || got["n2"].ID != n2ID {
		t.Fatalf("the name n2 after the rogue's claim: exit %d %+v", code, got)
	}
	// Its calls are refused and counted.
	before := n2.status().Rejected["call_unauthorized"]
	resp := rogue.call(t, n2ID, plugins.Request{ID: "r1", Tribe: "db", Plugin: "echo", Method: "echo"})
	if resp.OK || resp.Code != plugins.CodeUnauthorized {
		t.Fatalf("rogue -> n2: %+v", resp)
	}
	if after := n2.status().Rejected["call_unauthorized"]; after != before+1 {
		t.Fatalf("n2 counted %d refused calls, want %d", after, before+1)
	}

	// Revoked, n1 leaves db everywhere and its calls are refused again.
	if _, stderr, code := tribe("revoke", "n1", "--data-dir", admin.dir); code != 0 {
		t.Fatalf("revoke n1: %s", stderr)
	}
	waitUntil(t, 30*time.Second, "n2 to see n1 revoked", func() bool {
		var ns []api.Node
		n2.cliJSON(&ns, "nodes")
		for _, n := range ns {
			if n.ID == n1ID {
				return n.Admission == "revoked"
			}
		}
		return false
	})
	got, _, code = callLines(t, n1, "--node", n2ID, "echo", "echo")
	if code != 1 || got["n2"].Code != "unauthorized" {
		t.Fatalf("revoked n1 -> n2: exit %d %+v", code, got)
	}
}

// rogue is an outsider: a libp2p host with a fresh identity that speaks
// the state topic and the call protocol.
type rogue struct {
	h     host.Host
	id    peer.ID
	key   crypto.PrivKey
	topic *pubsub.Topic
}

func newRogue(t *testing.T, target string) *rogue {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := libp2p.New(libp2p.Identity(key), libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ps, err := pubsub.NewGossipSub(ctx, h, gossip.PubSubOptions("")...)
	if err != nil {
		t.Fatal(err)
	}
	topic, err := ps.Join("tribe/tribe/state/1")
	if err != nil {
		t.Fatal(err)
	}
	ai, err := peer.AddrInfoFromP2pAddr(ma.StringCast(target))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Connect(ctx, *ai); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "the rogue to join the state topic", func() bool { return len(topic.ListPeers()) > 0 })
	return &rogue{h: h, id: h.ID(), key: key, topic: topic}
}

func (r *rogue) publish(t *testing.T, key, value string) {
	t.Helper()
	s, err := gossip.Sign(gossip.Entry{Key: key, Value: json.RawMessage(value), HLC: gossip.MakeHLC(time.Now().UnixMilli(), 0)}, r.key)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.topic.Publish(context.Background(), s.Raw); err != nil {
		t.Fatal(err)
	}
}

func (r *rogue) call(t *testing.T, to string, req plugins.Request) plugins.Response {
	t.Helper()
	id, err := peer.Decode(to)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return plugins.Call(ctx, r.h, id, req)
}

// A host admitted ahead of its first start: `tribe id` makes its identity
// and prints its peer ID, a trusted writer admits that ID under a name,
// and the host counts from its first record. Misused, --name is a usage
// error and writes nothing.
func TestAdmitAheadEndToEnd(t *testing.T) {
	admin := newAgent(t, "admin")
	adminID := presetIdentity(t, admin)
	admin.args = append(admin.args, "--trusted", adminID)
	admin.start()
	web := newAgent(t, "web-7", "--join", admin.tcpJoin(), "--trusted", adminID)
	var id struct {
		ID      string `json:"id"`
		Created bool   `json:"created"`
	}
	if out, stderr, code := tribe("id", "--json", "--data-dir", web.dir); code != 0 || json.Unmarshal([]byte(out), &id) != nil || !id.Created {
		t.Fatalf("tribe id --json on a new data dir: exit %d %q %s", code, out, stderr)
	}
	if again := presetIdentity(t, web); again != id.ID {
		t.Fatalf("tribe id again: %s, then %s", id.ID, again)
	}
	for _, args := range [][]string{
		{"admit", "--name", "web-7"},
		{"admit", id.ID, adminID, "--name", "web-7"},
		{"admit", "--all-pending", "--name", "web-7"},
		{"admit", id.ID, "--name", ""},
	} {
		if _, stderr, code := tribe(append(args, "--data-dir", admin.dir)...); code != 2 {
			t.Fatalf("tribe %v: exit %d, want 2 (usage) %s", args, code, stderr)
		}
	}
	if _, stderr, code := tribe("admit", id.ID, "--data-dir", admin.dir); code != 1 || !strings.Contains(stderr, "--name NAME") {
		t.Fatalf("admit by a peer ID with no record: exit %d %q, want the hint", code, stderr)
	}
	if _, stderr, code := tribe("admit", "web-7", "--name", "web-7", "--data-dir", admin.dir); code != 1 || !strings.Contains(stderr, "peer ID") {
		t.Fatalf("admit ahead by a name: exit %d %q", code, stderr)
	}
	out, stderr, code := tribe("admit", id.ID, "--name", "web-7", "--data-dir", admin.dir)
	if code != 0 || !strings.Contains(out, "web-7") || !strings.Contains(out, "admitted") {
		t.Fatalf("admit ahead: exit %d %s%s", code, out, stderr)
	}
	web.start()
	if st := web.status(); st.ID != id.ID {
		t.Fatalf("web-7 runs as %s, tribe id said %s", st.ID, id.ID)
	}
	waitUntil(t, 60*time.Second, "web-7 admitted from its first record, on itself and on admin", func() bool {
		var ns []api.Node
		admin.cliJSON(&ns, "nodes")
		return web.status().Admission == "admitted" && len(ns) == 2 && slices.ContainsFunc(ns, func(n api.Node) bool {
			return n.ID == id.ID && n.Admission == "admitted"
		})
	})
}
