package gossip

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// TestCheckResponse: what a puller refuses from a responder before it
// opens a single entry.
func TestCheckResponse(t *testing.T) {
	root := NodeRef{}
	n1 := NodeRef{Depth: 1, Value: 3}
	lo, _ := n1.span()
	req := SyncRequest{Probes: []Probe{{Node: root}, {Node: n1}}, Want: []uint64{10, 20, 30}}
	children := make([]uint64, 16)
	items := []ItemSummary{{lo, 1}, {lo + 1, 1}}
	entries := func(n int) [][]byte { return make([][]byte, n) }
	for _, tc := range []struct {
		name string
		req  SyncRequest
		resp SyncResponse
		err  error
	}{
		{"nothing differs", SyncRequest{Probes: []Probe{{Node: root}}}, SyncResponse{}, nil},
		{"all of it", req, SyncResponse{Nodes: []NodeReply{{Node: root, Children: children}, {Node: n1, Items: items}}, Served: 3, Entries: entries(3)}, nil},
		{"some wants served, fewer exist", req, SyncResponse{Served: 2, Entries: entries(1)}, nil},
		{"no items under a node", req, SyncResponse{Nodes: []NodeReply{{Node: n1}}, Served: 1}, nil},
		{"more served than asked", req, SyncResponse{Served: 4}, ErrBadSyncMessage},
		{"no want served", req, SyncResponse{}, ErrBadSyncMessage},
		{"more entries than served", req, SyncResponse{Served: 1, Entries: entries(2)}, ErrUnwanted},
		{"entries with no wants", SyncRequest{Probes: []Probe{{Node: root}}}, SyncResponse{Entries: entries(1)}, ErrUnwanted},
		{"a node not asked about", req, SyncResponse{Nodes: []NodeReply{{Node: NodeRef{Depth: 1, Value: 4}}}, Served: 1}, ErrBadSyncMessage},
		{"a node twice", req, SyncResponse{Nodes: []NodeReply{{Node: n1}, {Node: n1}}, Served: 1}, ErrBadSyncMessage},
		{"children at the deepest node", SyncRequest{Probes: []Probe{{Node: NodeRef{Depth: MaxDepth}}}}, SyncResponse{Nodes: []NodeReply{{Node: NodeRef{Depth: MaxDepth}, Children: children}}}, ErrBadSyncMessage},
		{"15 children", req, SyncResponse{Nodes: []NodeReply{{Node: root, Children: children[:15]}}, Served: 1}, ErrBadSyncMessage},
		{"an item outside its node", req, SyncResponse{Nodes: []NodeReply{{Node: n1, Items: []ItemSummary{{lo - 1, 1}}}}, Served: 1}, ErrBadSyncMessage},
		{"items out of order", req, SyncResponse{Nodes: []NodeReply{{Node: n1, Items: []ItemSummary{items[1], items[0]}}}, Served: 1}, ErrBadSyncMessage},
		{"an item twice", req, SyncResponse{Nodes: []NodeReply{{Node: n1, Items: []ItemSummary{items[0], items[0]}}}, Served: 1}, ErrBadSyncMessage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckResponse(tc.req, tc.resp)
			if !errors.Is(err, tc.err) {
				t.Fatalf("CheckResponse = %v, want %v", err, tc.err)
			}
		})
	}
}

// TestCheckRequest: what a responder refuses before it builds a reply.
func TestCheckRequest(t *testing.T) {
	a, b := NodeRef{Depth: 2, Value: 1}, NodeRef{Depth: 2, Value: 2}
	for _, tc := range []struct {
		name string
		req  SyncRequest
		err  error
	}{
		{"empty", SyncRequest{}, nil},
		{"the first", SyncRequest{Probes: []Probe{{}}}, nil},
		{"distinct, in any order", SyncRequest{Probes: []Probe{{Node: b}, {Node: a}, {Node: NodeRef{Depth: 3, Value: 1}}}, Want: []uint64{3, 1, 2}}, nil},
		{"a node twice", SyncRequest{Probes: []Probe{{Node: a}, {Node: b}, {Node: a, Hash: 9}}}, ErrBadSyncMessage},
		{"the root 131,072 times", SyncRequest{Probes: make([]Probe, maxProbes)}, ErrBadSyncMessage},
		{"a key twice", SyncRequest{Want: []uint64{5, 1, 5}}, ErrBadSyncMessage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := CheckRequest(tc.req); !errors.Is(err, tc.err) {
				t.Fatalf("CheckRequest = %v, want %v", err, tc.err)
			}
		})
	}
}

func TestServedWants(t *testing.T) {
	got := ServedWants(SyncRequest{Want: []uint64{10, 20, 30}}, SyncResponse{Served: 2})
	if len(got) != 2 || !got[10] || !got[20] {
		t.Fatalf("ServedWants = %v, want 10 and 20", got)
	}
}

// TestToRelay: of what a pull from a peer brought, only the peer's own
// entries written in the last relayFresh are passed on, at most maxRelay,
// and none under a quiet key (a job's ack, meant for the job's writer).
func TestToRelay(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	author, other := peer.ID("author"), peer.ID("other")
	entry := func(key string, by peer.ID, age time.Duration) *Change {
		return &Change{Key: key, New: &Signed{Entry: Entry{Key: key, Author: by, HLC: MakeHLC(now.Add(-age).UnixMilli(), 0)}}}
	}
	quiet := func(key string) bool { return strings.HasPrefix(key, "jobs/") }
	keys := func(es []*Signed) []string {
		var out []string
		for _, e := range es {
			out = append(out, e.Key)
		}
		return out
	}
	changes := []*Change{
		entry("nodes/author", author, time.Second),
		entry("jobs/1/acks/author", author, time.Second),
		entry("nodes/other", other, time.Second),
		entry("tribes/web/members/author/policy", author, relayFresh+time.Second),
		{Key: "gone"},
		entry("tribes/db/members/author/policy", author, 0),
	}
	if got := keys(toRelay(author, changes, now, quiet)); !slices.Equal(got, []string{"nodes/author", "tribes/db/members/author/policy"}) {
		t.Fatalf("relayed %v, want the author's fresh entries outside jobs/", got)
	}
	if got := keys(toRelay(author, changes, now, nil)); !slices.Contains(got, "jobs/1/acks/author") {
		t.Fatalf("with no quiet keys: relayed %v, want the ack too", got)
	}
	var many []*Change
	for i := range 2 * maxRelay {
		many = append(many, entry(fmt.Sprintf("k/%d", i), author, 0))
	}
	if got := toRelay(author, many, now, quiet); len(got) != maxRelay {
		t.Fatalf("relayed %d of %d fresh entries, want at most %d", len(got), len(many), maxRelay)
	}
}
