package gossip

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
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
		{"a node with its parent", SyncRequest{Probes: []Probe{{Node: b}, {Node: a.Child(3)}, {Node: a}}}, ErrBadSyncMessage},
		{"a node with the root", SyncRequest{Probes: []Probe{{Node: a}, {}}}, ErrBadSyncMessage},
		{"a node with a distant ancestor", SyncRequest{Probes: []Probe{{Node: NodeRef{Depth: MaxDepth, Value: 1<<60 | 7}}, {Node: NodeRef{Depth: 1, Value: 1}}}}, ErrBadSyncMessage},
		{"every node of depth 4", SyncRequest{Probes: probesAt(4)}, nil},
		{"every node of depths 1 to 4", SyncRequest{Probes: slices.Concat(probesAt(1), probesAt(2), probesAt(3), probesAt(4))}, ErrBadSyncMessage},
		{"a node that is none", SyncRequest{Probes: []Probe{{Node: NodeRef{Depth: 1, Value: 16}}}}, ErrBadSyncMessage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := CheckRequest(tc.req); !errors.Is(err, tc.err) {
				t.Fatalf("CheckRequest = %v, want %v", err, tc.err)
			}
		})
	}
}

// probesAt probes every node at depth d with a wrong hash.
func probesAt(d uint8) []Probe {
	var out []Probe
	for v := range uint64(1) << (4 * d) {
		out = append(out, Probe{Node: NodeRef{Depth: d, Value: v}, Hash: 1})
	}
	return out
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

// putUnchecked puts e in s as Apply would, without checking it or
// indexing its key for Prefix: for states of hundreds of thousands of
// keys, built fast.
func putUnchecked(s *State, e *Signed) {
	s.entries[e.Key] = e
	s.digestOf(e.Key).put(e.Key, keyHash(e.Key), versionHash(e))
}

// bigState is a state of n entries of size bytes each (not signed: Raw
// is the key, padded), for pulls of a large difference.
func bigState(n, size int) *State {
	s := NewState(NewTrust())
	for i := range n {
		key := fmt.Sprintf("tribes/t%d", i)
		raw := make([]byte, size)
		copy(raw, key)
		putUnchecked(s, &Signed{Entry: Entry{Key: key, HLC: MakeHLC(t0.UnixMilli(), 0)}, Raw: raw, Hash: sha256.Sum256(raw)})
	}
	return s
}

// pullStats is what pullAcross took: rounds, bytes both ways, the most
// probes and wants in a request, and the largest message.
type pullStats struct {
	rounds, bytes, probes, wants, largest int
}

// pullAcross pulls everything src holds into dst, round by round through
// the codec and both sides' checks, as the shell does; an entry is
// applied by finding it in src by the key its Raw starts with.
func pullAcross(t *testing.T, dst, src *State) pullStats {
	t.Helper()
	var st pullStats
	req := dst.StartPull(Full)
	for st.rounds = 1; st.rounds < 1000; st.rounds++ {
		qb := EncodeRequest(req)
		dreq, err := DecodeRequest(qb)
		if err == nil {
			err = CheckRequest(dreq)
		}
		if err != nil {
			t.Fatalf("round %d: request of %d probes, %d wants refused: %v", st.rounds, len(req.Probes), len(req.Want), err)
		}
		rb := EncodeResponse(src.Respond(dreq, respondBudget, Full))
		for _, b := range [][]byte{qb, rb} {
			if err := WriteMsg(io.Discard, b); err != nil {
				t.Fatalf("round %d (%d probes, %d wants): %v", st.rounds, len(req.Probes), len(req.Want), err)
			}
			st.bytes += len(b)
			st.largest = max(st.largest, len(b))
		}
		st.probes, st.wants = max(st.probes, len(req.Probes)), max(st.wants, len(req.Want))
		resp, err := DecodeResponse(rb)
		if err == nil {
			err = CheckResponse(req, resp)
		}
		if err != nil {
			t.Fatalf("round %d: response refused: %v", st.rounds, err)
		}
		for _, raw := range resp.Entries {
			key, _, _ := strings.Cut(string(raw), "\x00")
			putUnchecked(dst, src.entries[key])
		}
		next, done := dst.NextPull(req, resp, Full, nil)
		if done {
			return st
		}
		req = next
	}
	t.Fatalf("no end after %d rounds", st.rounds)
	return st
}

// TestPullLargeDifference: a puller that holds nothing of 300,000 keys
// gets them all, every message within MaxSyncMessage and every request
// within the responder's checks. Node replies were not budgeted: the
// fifth round probed 64,865 nodes, the answer was 5.2 MB, and every pull
// failed.
func TestPullLargeDifference(t *testing.T) {
	const keys, size = 300_000, 64
	src, dst := bigState(keys, size), NewState(NewTrust())
	st := pullAcross(t, dst, src)
	t.Logf("%d keys of %d bytes: %d rounds, %.1f MiB in all, largest message %.2f MiB, at most %d probes and %d wants a request",
		keys, size, st.rounds, float64(st.bytes)/(1<<20), float64(st.largest)/(1<<20), st.probes, st.wants)
	if dst.Root() != src.Root() || dst.Len() != keys {
		t.Fatalf("after the pull: %d keys held of %d", dst.Len(), keys)
	}
	if st.probes > maxPullProbes || st.wants > maxPullWants {
		t.Fatalf("%d probes, %d wants in a request: over %d, %d", st.probes, st.wants, maxPullProbes, maxPullWants)
	}
}

// TestRespondBudgetsNodeReplies: a request of more probes than fit a
// response (a puller of an earlier version) is answered for a prefix of
// them, within respondNodeBudget.
func TestRespondBudgetsNodeReplies(t *testing.T) {
	s := bigState(200_000, 8)
	var req SyncRequest
	for v := range uint64(1 << 16) {
		req.Probes = append(req.Probes, Probe{Node: NodeRef{Depth: 4, Value: v}, Hash: 1})
	}
	resp := s.Respond(req, respondBudget, Full)
	size := 0
	for _, r := range resp.Nodes {
		size += replySize(r)
	}
	if size > respondNodeBudget || len(resp.Nodes) == 0 || len(resp.Nodes) == len(req.Probes) {
		t.Fatalf("%d of %d probes answered in %d bytes: want a prefix within %d", len(resp.Nodes), len(req.Probes), size, respondNodeBudget)
	}
	if err := WriteMsg(io.Discard, EncodeResponse(resp)); err != nil {
		t.Fatal(err)
	}
	if err := CheckResponse(req, resp); err != nil {
		t.Fatal(err)
	}
}

// TestNodeBudgetsFit: the most a puller's request can make a response
// carry fits a message, and maxNodeReply is the most one reply takes.
func TestNodeBudgetsFit(t *testing.T) {
	if most := respondNodeBudget + respondBudget + MaxEntrySize + 1<<10; most > MaxSyncMessage {
		t.Fatalf("a response may take %d bytes, over %d", most, MaxSyncMessage)
	}
	items := make([]ItemSummary, leafItems)
	for _, r := range []NodeReply{
		{Node: NodeRef{Depth: MaxDepth - 1, Value: 1<<60 - 1}, Children: make([]uint64, 16)},
		{Node: NodeRef{Depth: MaxDepth, Value: ^uint64(0)}, Items: items},
	} {
		enc := EncodeResponse(SyncResponse{Nodes: []NodeReply{r}})
		if got := len(enc) - len(EncodeResponse(SyncResponse{})); got != replySize(r) || got > maxNodeReply {
			t.Fatalf("a reply of %d bytes, replySize %d, maxNodeReply %d", got, replySize(r), maxNodeReply)
		}
	}
}
