package node

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/gossip"
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

// A peer's record that checkRecord refuses is refused however it comes
// (handed over, published, pulled), counted, and not asked for again;
// the record held before stays, and the node's views show it.
func TestBadRecordRefusedOnEveryPath(t *testing.T) {
	ctx := context.Background()
	a := startNode(t, loopbackConfig(t, "a"))
	sc := loopbackConfig(t, "s")
	sc.Join, sc.SyncInterval = []string{tcpAddr(a)}, time.Hour
	s := startNode(t, sc)
	key := nodesPrefix + s.ID().String()
	waitFor(t, "a holds s's record", func() bool { _, ok := a.replica.Get(key); return ok })

	bad, err := s.replica.PutQuiet(ctx, key, []byte(`{"name":"db7\u001b[2K\rweb1","addrs":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.replica.Push(ctx, a.ID(), bad); err == nil {
		t.Error("the push was taken")
	}
	if got := a.recordRefused.Load(); got != 1 {
		t.Fatalf("after the push: %d refused, want 1", got)
	}
	s.replica.Announce(ctx, bad)
	waitFor(t, "the published record refused", func() bool { return a.recordRefused.Load() == 2 })
	// Pulled: a version refused by any path but a push is remembered, so
	// the one published is not asked for; a new one is, once.
	if st, err := a.replica.SyncWith(ctx, s.ID()); err != nil || st.Fetched != 0 || st.Skipped != 1 {
		t.Fatalf("a pull after the published record was refused: %+v %v, want it skipped", st, err)
	}
	bad, err = s.replica.PutQuiet(ctx, key, []byte(`{"name":"s","version":"\u202e1.0"}`))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int64{3, 3} {
		if _, err := a.replica.SyncWith(ctx, s.ID()); err != nil {
			t.Fatalf("pull %d: %v", i, err)
		}
		if got := a.recordRefused.Load(); got != want {
			t.Fatalf("after pull %d of the new version: %d refused, want %d", i, got, want)
		}
	}
	if got := a.rejected()["record_refused"]; got != 3 {
		t.Errorf("record_refused %d, want 3 (a push, a message, a pull)", got)
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
