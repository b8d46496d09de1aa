package node

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/gossip/authority"
	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/keys"
	"github.com/tribeagent/tribe/node/api"
)

func TestCheckRecord(t *testing.T) {
	long := make([]int, 1025)
	longFacts, _ := json.Marshal(map[string]any{"l": long})
	for _, c := range []struct {
		name, value, want string // want: "" takes it
	}{
		{"a record", `{"name":"web-1","addrs":["/ip4/10.0.0.1/tcp/4001/p2p/x"],"version":"0.1.0","facts":{"os":"linux","cpus":4}}`, ""},
		{"no name, no facts", `{"addrs":[]}`, ""},
		{"a name in Czech", `{"name":"kůň"}`, ""},
		{"fields of a later version", `{"name":"a","zone":{"x":1}}`, ""},
		{"not JSON", `{"name":`, "not a node record"},
		{"a name that is a number", `{"name":7}`, "not a node record"},
		{"an escape in the name", `{"name":"a\u001b[2Kb"}`, "not printable"},
		{"a tab in the name", `{"name":"a\tb"}`, "not printable"},
		{"a bidi override in the name", `{"name":"a\u202eb"}`, "not printable"},
		{"a name of 65 bytes", fmt.Sprintf(`{"name":%q}`, strings.Repeat("a", 65)), "a name of 65 bytes"},
		{"a control in the version", `{"name":"a","version":"1\u0007"}`, "the version"},
		{"a version of 129 bytes", fmt.Sprintf(`{"version":%q}`, strings.Repeat("1", 129)), "a version of 129"},
		{"a newline in an address", `{"addrs":["/ip4/1.2.3.4\n/tcp/1"]}`, "the address"},
		{"facts past the bounds", `{"name":"a","facts":` + string(longFacts) + `}`, "facts past the bounds"},
	} {
		err := checkRecord([]byte(c.value))
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}

// A policy membership must read as one, with at most maxClaimedPolicies
// valid policy names in at most maxMembershipValue bytes; checkValue asks
// it of policy memberships only (a plugin named policy is not one).
func TestCheckPolicyMembership(t *testing.T) {
	p := "12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo"
	many := make([]string, maxClaimedPolicies+1)
	for i := range many {
		many[i] = fmt.Sprintf("p%d", i)
	}
	tooMany, _ := json.Marshal(memberRecord{Policies: many})
	enough, _ := json.Marshal(memberRecord{Policies: many[:maxClaimedPolicies]})
	for _, c := range []struct {
		name, key, value, want string // want: "" takes it
	}{
		{"a membership", "tribes/web/members/" + p + "/policy", `{"policies":["web","all"]}`, ""},
		{"no policies", "tribes/web/members/" + p + "/policy", `{}`, ""},
		{"fields of a later version", "tribes/web/members/" + p + "/policy", `{"policies":["web"],"since":3}`, ""},
		{"as many policies as may be", "tribes/web/members/" + p + "/policy", string(enough), ""},
		{"one policy more", "tribes/web/members/" + p + "/policy", string(tooMany), "naming 33 policies"},
		{"not JSON", "tribes/web/members/" + p + "/policy", `{"policies":`, "not a policy membership"},
		{"a name that is not one", "tribes/web/members/" + p + "/policy", `{"policies":["Web"]}`, "not a policy name"},
		{"padding", "tribes/web/members/" + p + "/policy", `{"policies":[],"x":"` + strings.Repeat("x", maxMembershipValue) + `"}`, "at most 4096"},
		{"a plugin named policy", "tribes/web/plugins/policy", `{"x":"` + strings.Repeat("x", maxMembershipValue) + `"}`, ""},
		{"a manual membership", "tribes/web/members/" + p + "/manual", `{}`, ""},
	} {
		e := &gossip.Signed{Entry: gossip.Entry{Key: c.key, Value: []byte(c.value)}}
		err := checkValue(e)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}

// A peer's record that checkRecord refuses is refused however it comes
// (handed over, published, pulled), counted, and not asked for again;
// the record held before stays, and the node's views show it.
func TestBadRecordRefusedOnEveryPath(t *testing.T) {
	ctx := context.Background()
	ac := loopbackConfig(t, "a")
	ac.SyncInterval = time.Hour // the test's pulls only
	a := startNode(t, ac)
	sc := loopbackConfig(t, "s")
	sc.Join, sc.SyncInterval = []string{tcpAddr(a)}, time.Hour
	s := startNode(t, sc)
	key := nodesPrefix + s.ID().String()
	waitFor(t, "a holds s's record", func() bool { _, ok := a.replica.Get(key); return ok })
	refused := func() int64 { return a.rejected()["value_refused"] }

	bad, err := s.replica.PutQuiet(ctx, key, []byte(`{"name":"db7\u001b[2K\rweb1","addrs":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.replica.Push(ctx, a.ID(), bad); err == nil {
		t.Error("the push was taken")
	}
	if got := refused(); got != 1 {
		t.Fatalf("after the push: %d refused, want 1", got)
	}
	s.replica.Announce(ctx, bad)
	// Published, it is refused by pubsub's check; a pull may take it
	// first (either counts).
	waitFor(t, "the published record refused", func() bool { return refused() >= 2 })
	// A version is fetched at most once: the second pull skips it. A new
	// version is fetched once too.
	for v := range 2 {
		if v == 1 {
			if bad, err = s.replica.PutQuiet(ctx, key, []byte(`{"name":"s","version":"\u202e1.0"}`)); err != nil {
				t.Fatal(err)
			}
		}
		before := refused()
		// Pulled until skipped: fetched and refused once, whether by these
		// pulls or by one of a's own that got there first.
		waitFor(t, "the version skipped", func() bool {
			st, err := a.replica.SyncWith(ctx, s.ID())
			if err != nil {
				t.Fatalf("version %d: %v", v, err)
			}
			return st.Skipped > 0 && st.Fetched == 0
		})
		if got := refused() - before; v == 1 && got != 1 {
			t.Errorf("a new bad version refused %d times, want once", got)
		}
	}
	if got := refused(); got < 3 || got > 4 {
		t.Errorf("value_refused %d, want 3 or 4 (a push, a message or a pull of it, a pull of the next)", got)
	}
	held, _ := a.replica.Get(key)
	if held.Hash == bad.Hash {
		t.Fatal("a holds the refused record")
	}
	nodes, err := a.Nodes(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == s.ID().String() && n.Name != "s" {
			t.Errorf("a names s %q, want its earlier record's name", n.Name)
		}
	}
}

// What the record check adds to taking a record from a peer: a real
// node's record checked, beside opening its entry (the signature check
// every entry pays), in one run.
func BenchmarkCheckRecordVsOpen(b *testing.B) {
	a := startNode(b, loopbackConfig(b, "a"))
	e, _ := a.replica.Get(nodesPrefix + a.ID().String())
	var check, open time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := checkRecord(e.Value); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := gossip.Open(e.Raw); err != nil {
			b.Fatal(err)
		}
		check, open = check+t1.Sub(t0), open+time.Since(t1)
	}
	b.ReportMetric(float64(check.Nanoseconds())/float64(b.N), "check-ns/op")
	b.ReportMetric(float64(open.Nanoseconds())/float64(b.N), "open-ns/op")
	b.ReportMetric(float64(check)/float64(open), "check/open")
	b.ReportMetric(float64(len(e.Value)), "record-bytes")
}

func TestHostName(t *testing.T) {
	for _, c := range []struct {
		h    string
		err  error
		want string
	}{
		{"web-1", nil, "web-1"},
		{"", nil, "tribe"},
		{"web-1", errors.New("no name"), "tribe"},
		{strings.Repeat("h", 65), nil, "tribe"},
		{"we\x1bb", nil, "tribe"},
	} {
		if got := hostName(c.h, c.err); got != c.want {
			t.Errorf("hostName(%q, %v) = %q, want %q", c.h, c.err, got, c.want)
		}
	}
}

// An admission that does not read is refused (value_refused), and the
// admission held stands: it once revoked its node on every node that
// took it.
func TestUnreadableAdmissionChangesNothing(t *testing.T) {
	admin, ca := trustedAdmin(t)
	adminKey, _, err := keys.LoadOrCreateIdentity(filepath.Join(ca.DataDir, keys.IdentityFile))
	if err != nil {
		t.Fatal(err)
	}
	b := joinAdmin(t, admin, ca, "b", nil)
	if _, err := admin.Admit(context.Background(), api.AdmitRequest{Nodes: []string{"b"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see its admission", func() bool { return b.rules().Status(b.ID()) == authority.Admitted })
	key := authority.AdmittedPrefix + b.ID().String()
	held, _ := b.replica.Get(key)
	for _, v := range []string{`{"state":"maybe"}`, `not json`} {
		bad, err := gossip.Sign(gossip.Entry{Key: key, Value: []byte(v), HLC: gossip.Next(held.HLC, time.Now())}, adminKey)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.replica.Accept(admin.ID(), bad.Raw); !errors.Is(err, gossip.ErrValueRefused) {
			t.Fatalf("%s: %v, want ErrValueRefused", v, err)
		}
	}
	if s := b.rules().Status(b.ID()); s != authority.Admitted {
		t.Fatalf("b is %s after unreadable admissions, want admitted", s)
	}
}

// FuzzCheckRecord: a record is any peer's to write, and every node checks
// it. What it takes has a bounded, printable name and version, and its
// facts decode.
func FuzzCheckRecord(f *testing.F) {
	f.Add([]byte(`{"name":"web-1","addrs":["/ip4/10.0.0.1/tcp/4001"],"version":"0.1.0","facts":{"os":"linux"}}`))
	f.Add([]byte(`{"name":"a\u001b[31mb"}`))
	f.Add([]byte(`{"name":"` + strings.Repeat("a", 65) + `"}`))
	f.Add([]byte(`{"facts":{"a":{"b":{"c":{"d":{"e":{"f":{"g":{"h":{"i":1}}}}}}}}}}`))
	f.Add([]byte(`{"plugins":{"t/p":{"error":"x"}},"tasks":{"t/x":{"runs":1}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if checkRecord(b) != nil {
			return
		}
		var rec nodeRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return // fields checkRecord does not read may not decode here
		}
		if len(rec.Name) > maxNameLen || !names.Printable(rec.Name) || len(rec.Version) > maxVersionLen || !names.Printable(rec.Version) {
			t.Fatalf("took %q: name %q, version %q", b, rec.Name, rec.Version)
		}
		rec.facts()
	})
}

// FuzzCheckPolicyMembership: a policy membership is its node's to write,
// naming any tribe, and every node checks it. What it takes is at most
// maxMembershipValue bytes naming at most maxClaimedPolicies valid policy
// names, as the views read it.
func FuzzCheckPolicyMembership(f *testing.F) {
	f.Add([]byte(`{"policies":["web","all"]}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"policies":["Web"]}`))
	f.Add([]byte(`{"policies":null,"x":[1,2]}`))
	f.Add([]byte(`{"policies":"web"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if checkPolicyMembership(b) != nil {
			return
		}
		var rec memberRecord
		if err := json.Unmarshal(b, &rec); err != nil || len(b) > maxMembershipValue || len(rec.Policies) > maxClaimedPolicies {
			t.Fatalf("took %q: %d bytes, %d policies, %v", b, len(b), len(rec.Policies), err)
		}
		for _, p := range rec.Policies {
			if !gossip.ValidName(p) {
				t.Fatalf("took %q naming %q", b, p)
			}
		}
	})
}

// The fleet's views read each record decoded once (recordAt): a node
// that writes a new record is shown by it, names and facts alike (a
// `where` filter reads the facts the decoded record leaves in its entry),
// and a record replaced or deleted leaves nothing of it behind.
func TestNodesShowEachNodesLatestRecord(t *testing.T) {
	ctx := context.Background()
	a := startNode(t, loopbackConfig(t, "a"))
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(key)
	var hlc gossip.HLC
	write := func(rec map[string]any) {
		t.Helper()
		v, _ := json.Marshal(rec)
		hlc = gossip.Next(hlc, time.Now())
		s, err := gossip.Sign(gossip.Entry{Key: nodesPrefix + id.String(), Value: v, HLC: hlc}, key)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.replica.Accept(id, s.Raw); err != nil {
			t.Fatal(err)
		}
	}
	listed := func(where string) []string {
		t.Helper()
		nodes, err := a.NodesWithFacts(ctx, where)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, nd := range nodes {
			if nd.ID == id.String() {
				out = append(out, fmt.Sprint(nd.Name, " ", nd.Facts["role"]))
			}
		}
		return out
	}
	write(map[string]any{"name": "x1", "facts": map[string]any{"role": "web"}})
	if got := listed(`facts.role == "web"`); !slices.Equal(got, []string{"x1 web"}) {
		t.Fatalf("first record: %v", got)
	}
	write(map[string]any{"name": "x2", "facts": map[string]any{"role": "db"}})
	if got := listed(`facts.role == "web"`); len(got) != 0 {
		t.Fatalf("the replaced record's facts still match: %v", got)
	}
	if got := listed(""); !slices.Equal(got, []string{"x2 db"}) {
		t.Fatalf("second record: %v", got)
	}
	if rec, ok := a.nodeNamed(id); !ok || rec.Name != "x2" {
		t.Fatalf("named %+v %v, want x2", rec, ok)
	}
	hlc = gossip.Next(hlc, time.Now().Add(gossip.PendingRewrite))
	gone, _ := gossip.Sign(gossip.Entry{Key: nodesPrefix + id.String(), Deleted: true, HLC: hlc}, key)
	if _, err := a.replica.Accept(id, gone.Raw); err != nil {
		t.Fatal(err)
	}
	if got := listed(""); len(got) != 0 {
		t.Fatalf("a deleted record listed: %v", got)
	}
	if _, kept := a.records.Load(nodesPrefix + id.String()); kept {
		t.Error("a deleted record is still kept decoded")
	}
}
