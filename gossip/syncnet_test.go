package gossip

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
)

// The sync protocol against hostile peers, on mocknet: one replica, and
// bare hosts (no pubsub, no replica) that speak the protocol by hand.

type testClock struct{ ns atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.ns.Store(t0.UnixNano())
	return c
}

func (c *testClock) now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *testClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// warnCounter is a slog handler that counts Warn records by their "peer",
// and keeps the last "suppressed" said about each.
type warnCounter struct {
	mu         sync.Mutex
	warns      map[string]int
	suppressed map[string]int64
}

func (w *warnCounter) Enabled(context.Context, slog.Level) bool { return true }
func (w *warnCounter) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w *warnCounter) WithGroup(string) slog.Handler            { return w }

func (w *warnCounter) Handle(_ context.Context, rec slog.Record) error {
	if rec.Level != slog.LevelWarn {
		return nil
	}
	p, suppressed := "", int64(0)
	rec.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "peer":
			p = a.Value.String()
		case "suppressed":
			suppressed = a.Value.Int64()
		}
		return true
	})
	w.mu.Lock()
	w.warns[p]++
	w.suppressed[p] = suppressed
	w.mu.Unlock()
	return nil
}

func (w *warnCounter) count(p peer.ID) (warns int, lastSuppressed int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.warns[p.String()], w.suppressed[p.String()]
}

// testNet is a mocknet with one started replica on it.
type testNet struct {
	mn    mocknet.Mocknet
	r     *Replica
	h     host.Host
	clock *testClock
	logs  *warnCounter
	// psOpts are added to the replica's pubsub options.
	psOpts []pubsub.Option
	// trust, if set, is the replica's trust list (open if nil).
	trust []peer.ID
	// firstRequest, if set, replaces firstRequestTimeout; nextRequest
	// nextRequestTimeout.
	firstRequest, nextRequest time.Duration
	// counts, if set, is the replica's ReplicaConfig.Counts.
	counts func(peer.ID) bool
	// value, if set, is the replica's ReplicaConfig.Value.
	value func(*Signed) error
}

func newTestNet(t *testing.T) *testNet {
	t.Helper()
	return startTestNet(t, &testNet{mn: mocknet.New()})
}

// startTestNet starts n, set up but for its mocknet's first host.
func startTestNet(t testing.TB, n *testNet) *testNet {
	t.Helper()
	t.Cleanup(func() { n.mn.Close() })
	h, err := genPeer(n.mn)
	if err != nil {
		t.Fatal(err)
	}
	n.start(t, h)
	return n
}

// start runs the replica on h, which must not be connected yet.
func (n *testNet) start(t testing.TB, h host.Host) {
	t.Helper()
	store, err := OpenStore(filepath.Join(t.TempDir(), "state.db"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	cfg := DefaultReplicaConfig("tribe/test")
	cfg.SyncInterval = time.Hour // no pulls but the test's own
	cfg.SyncTimeout = 30 * time.Second
	if n.trust != nil {
		cfg.Trust = NewTrust(n.trust...)
	}
	cfg.Counts = n.counts
	cfg.Value = n.value
	n.h, n.clock, n.logs = h, newTestClock(), &warnCounter{warns: map[string]int{}, suppressed: map[string]int64{}}
	n.r, err = NewReplica(h, h.Peerstore().PrivKey(h.ID()), store, cfg, slog.New(n.logs), n.clock.now, rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	if n.firstRequest != 0 {
		n.r.firstRequest = n.firstRequest
	}
	if n.nextRequest != 0 {
		n.r.nextRequest = n.nextRequest
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ps, err := pubsub.NewGossipSub(ctx, h, append(PubSubOptions(cfg.Topic), n.psOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.r.Start(ps); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.r.Close() })
}

// peer adds a bare host connected to the replica's.
func (n *testNet) peer(t *testing.T) host.Host {
	t.Helper()
	h, err := genPeer(n.mn)
	if err != nil {
		t.Fatal(err)
	}
	n.connect(t, h)
	return h
}

// connect links and connects h, a host of the same mocknet, to the
// replica's.
func (n *testNet) connect(t *testing.T, h host.Host) {
	t.Helper()
	if _, err := n.mn.LinkPeers(h.ID(), n.h.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := n.mn.ConnectPeers(h.ID(), n.h.ID()); err != nil {
		t.Fatal(err)
	}
}

// wantRejected checks every counter of Rejected: those in want have those
// values, all others are 0.
func wantRejected(t *testing.T, r *Replica, want map[string]int64) {
	t.Helper()
	got := r.Rejected()
	full := map[string]int64{}
	for k := range got {
		full[k] = 0
	}
	maps.Copy(full, want)
	if !maps.Equal(got, full) {
		t.Fatalf("Rejected() = %v, want %v", got, full)
	}
}

// waitRejected waits until Rejected is what wantRejected expects.
func waitRejected(t *testing.T, r *Replica, want map[string]int64) {
	t.Helper()
	waitFor(t, func() bool {
		got := r.Rejected()
		for k, v := range got {
			if want[k] != v {
				return false
			}
		}
		return true
	})
	wantRejected(t, r, want)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Errorf("condition not met in 10 s")
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// readFrame reads one length-prefixed message without any limit: test
// peers trust the replica.
func readFrame(br *bufio.Reader) ([]byte, error) {
	n, err := binary.ReadUvarint(br)
	if err != nil {
		return nil, err
	}
	b := make([]byte, n)
	_, err = io.ReadFull(br, b)
	return b, err
}

// rogue is a peer that serves the sync protocol by hand and counts the
// streams opened to it.
type rogue struct {
	host.Host
	opens atomic.Int32
}

func newRogue(t *testing.T, n *testNet) *rogue {
	t.Helper()
	return &rogue{Host: n.peer(t)}
}

// serve answers pulls with answer, round by round; answer returns false
// to end the stream. It runs on the host's goroutines: no t.Fatal in it.
func (rg *rogue) serve(answer func(s network.Stream, round int, req SyncRequest) bool) {
	rg.SetStreamHandler(SyncProtocol, func(s network.Stream) {
		rg.opens.Add(1)
		defer s.Close()
		br := bufio.NewReader(s)
		for round := 1; ; round++ {
			b, err := readFrame(br)
			if err != nil {
				return
			}
			req, err := DecodeRequest(b)
			if err != nil || !answer(s, round, req) {
				return
			}
		}
	})
}

func respond(s network.Stream, resp SyncResponse) bool {
	return WriteMsg(s, EncodeResponse(resp)) == nil
}

// fakeItems are n items under the root, in key-hash order, that the
// replica does not hold.
func fakeItems(n int) []ItemSummary {
	items := make([]ItemSummary, n)
	for i := range items {
		items[i] = ItemSummary{KeyHash: keyHash(fmt.Sprintf("tribes/t%d", i)), VersionHash: 1}
	}
	slices.SortFunc(items, func(a, b ItemSummary) int { return cmpUint64(a.KeyHash, b.KeyHash) })
	return items
}

func cmpUint64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ownRecord is h's own node record, validly signed.
func ownRecord(t *testing.T, h host.Host) []byte {
	t.Helper()
	s, err := Sign(Entry{Key: "nodes/" + h.ID().String(), Value: []byte(`{"name":"rogue"}`), HLC: MakeHLC(t0.UnixMilli(), 0)}, h.Peerstore().PrivKey(h.ID()))
	if err != nil {
		t.Fatal(err)
	}
	return s.Raw
}

// forged is h's own record with its signature broken.
func forged(t *testing.T, h host.Host) []byte {
	raw := ownRecord(t, h)
	raw[len(raw)-5] ^= 0xff
	return raw
}

func repeat(b []byte, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

// TestSyncRogueResponder: a peer that answers pulls with anything but what
// the protocol allows ends the pull at its first response that does,
// before any more signature checks than the pull asked for; the refusal
// and the penalty are counted, and a second pull within the cool-down does
// not open a stream. A peer whose answer was merely cut short is counted
// but not penalised.
func TestSyncRogueResponder(t *testing.T) {
	items := fakeItems(10)
	for _, tc := range []struct {
		name   string
		answer func(t *testing.T, h host.Host) func(s network.Stream, round int, req SyncRequest) bool
		rounds int
		counts map[string]int64
		// penalised: a second pull opens no stream
		penalised bool
	}{
		{
			name: "forged entries for the wants",
			answer: func(t *testing.T, h host.Host) func(network.Stream, int, SyncRequest) bool {
				bad := forged(t, h)
				return func(s network.Stream, round int, req SyncRequest) bool {
					if round == 1 {
						return respond(s, SyncResponse{Nodes: []NodeReply{{Items: items}}})
					}
					return respond(s, SyncResponse{Served: len(req.Want), Entries: repeat(bad, len(req.Want))})
				}
			},
			rounds:    2,
			counts:    map[string]int64{"bad_signature": 1, "sync_penalised": 1},
			penalised: true,
		},
		{
			name: "forged entries never asked for, every round",
			answer: func(t *testing.T, h host.Host) func(network.Stream, int, SyncRequest) bool {
				bad := forged(t, h)
				return func(s network.Stream, round int, req SyncRequest) bool {
					return respond(s, SyncResponse{Nodes: []NodeReply{{Items: items}}, Entries: repeat(bad, 10)})
				}
			},
			rounds:    1,
			counts:    map[string]int64{"sync_unwanted": 1, "sync_penalised": 1},
			penalised: true,
		},
		{
			name: "a valid entry for another key than the want",
			answer: func(t *testing.T, h host.Host) func(network.Stream, int, SyncRequest) bool {
				good := ownRecord(t, h)
				return func(s network.Stream, round int, req SyncRequest) bool {
					if round == 1 {
						return respond(s, SyncResponse{Nodes: []NodeReply{{Items: items[:1]}}})
					}
					return respond(s, SyncResponse{Served: 1, Entries: [][]byte{good}})
				}
			},
			rounds:    2,
			counts:    map[string]int64{"sync_unwanted": 1, "sync_penalised": 1},
			penalised: true,
		},
		{
			name: "wants never served",
			answer: func(t *testing.T, h host.Host) func(network.Stream, int, SyncRequest) bool {
				return func(s network.Stream, round int, req SyncRequest) bool {
					if round == 1 {
						return respond(s, SyncResponse{Nodes: []NodeReply{{Items: items}}})
					}
					return respond(s, SyncResponse{})
				}
			},
			rounds:    2,
			counts:    map[string]int64{"sync_malformed": 1, "sync_penalised": 1},
			penalised: true,
		},
		{
			name: "a reply for a node not asked about",
			answer: func(t *testing.T, h host.Host) func(network.Stream, int, SyncRequest) bool {
				return func(s network.Stream, round int, req SyncRequest) bool {
					return respond(s, SyncResponse{Nodes: []NodeReply{{Node: NodeRef{Depth: 1, Value: 3}, Children: make([]uint64, 16)}}})
				}
			},
			rounds:    1,
			counts:    map[string]int64{"sync_malformed": 1, "sync_penalised": 1},
			penalised: true,
		},
		{
			name: "undecodable response",
			answer: func(t *testing.T, h host.Host) func(network.Stream, int, SyncRequest) bool {
				return func(s network.Stream, round int, req SyncRequest) bool {
					return WriteMsg(s, []byte("garbage")) == nil
				}
			},
			rounds:    1,
			counts:    map[string]int64{"sync_malformed": 1, "sync_penalised": 1},
			penalised: true,
		},
		{
			name: "oversized declaration",
			answer: func(t *testing.T, h host.Host) func(network.Stream, int, SyncRequest) bool {
				return func(s network.Stream, round int, req SyncRequest) bool {
					s.Write(binary.AppendUvarint(nil, MaxSyncMessage+1))
					return true
				}
			},
			rounds:    1,
			counts:    map[string]int64{"sync_malformed": 1, "sync_penalised": 1},
			penalised: true,
		},
		{
			name: "bad length prefix",
			answer: func(t *testing.T, h host.Host) func(network.Stream, int, SyncRequest) bool {
				return func(s network.Stream, round int, req SyncRequest) bool {
					s.Write([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
					return true
				}
			},
			rounds:    1,
			counts:    map[string]int64{"sync_malformed": 1, "sync_penalised": 1},
			penalised: true,
		},
		{
			name: "cut short",
			answer: func(t *testing.T, h host.Host) func(network.Stream, int, SyncRequest) bool {
				return func(s network.Stream, round int, req SyncRequest) bool {
					s.Write(append(binary.AppendUvarint(nil, 100), make([]byte, 10)...))
					return false // closes the stream
				}
			},
			rounds: 1,
			counts: map[string]int64{"sync_malformed": 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNet(t)
			rg := newRogue(t, n)
			rg.serve(tc.answer(t, rg.Host))
			ctx := context.Background()
			st, err := n.r.SyncWith(ctx, rg.ID())
			if err == nil {
				t.Fatalf("pull from a rogue succeeded: %+v", st)
			}
			if st.Rounds != tc.rounds {
				t.Errorf("pull ended after %d rounds, want %d (%v)", st.Rounds, tc.rounds, err)
			}
			wantRejected(t, n.r, tc.counts)
			if n.r.Len() != 0 {
				t.Errorf("the rogue's entries were applied: %d held", n.r.Len())
			}
			if got := n.r.Penalised(rg.ID()); got != tc.penalised {
				t.Fatalf("Penalised = %v, want %v", got, tc.penalised)
			}
			_, err = n.r.SyncWith(ctx, rg.ID())
			wantOpens := int32(2)
			if tc.penalised {
				wantOpens = 1
				if !errors.Is(err, ErrPenalised) {
					t.Errorf("second pull: %v, want ErrPenalised", err)
				}
			}
			if got := rg.opens.Load(); got != wantOpens {
				t.Errorf("the rogue saw %d streams, want %d", got, wantOpens)
			}
			// A pull not made (penalised) is not counted as one.
			if tot := n.r.SyncTotals(); tot.Pulls != int64(wantOpens) || tot.Failed != tot.Pulls {
				t.Errorf("SyncTotals %+v: want %d pulls, all failed", tot, wantOpens)
			}
		})
	}
}

// TestSyncPenaltyCoolsDown: a penalised peer's own pulls are refused
// (reset and counted) until the cool-down passes; then it is pulled from
// again.
func TestSyncPenaltyCoolsDown(t *testing.T) {
	n := newTestNet(t)
	items := fakeItems(3)
	rg := newRogue(t, n)
	bad := forged(t, rg.Host)
	rg.serve(func(s network.Stream, round int, req SyncRequest) bool {
		if round == 1 {
			return respond(s, SyncResponse{Nodes: []NodeReply{{Items: items}}})
		}
		return respond(s, SyncResponse{Served: len(req.Want), Entries: repeat(bad, len(req.Want))})
	})
	ctx := context.Background()
	if _, err := n.r.SyncWith(ctx, rg.ID()); err == nil {
		t.Fatal("pull from a rogue succeeded")
	}
	// The rogue pulls: refused.
	s, err := rg.NewStream(ctx, n.h.ID(), SyncProtocol)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteMsg(s, EncodeRequest(SyncRequest{Probes: []Probe{{}}})); err != nil {
		t.Fatal(err)
	}
	if b, err := readFrame(bufio.NewReader(s)); err == nil {
		t.Fatalf("a penalised peer was served %d bytes", len(b))
	}
	waitRejected(t, n.r, map[string]int64{"bad_signature": 1, "sync_penalised": 1, "sync_penalty_refused": 1})

	n.clock.advance(SyncCooldown - time.Second)
	if !n.r.Penalised(rg.ID()) {
		t.Fatal("the penalty ended before the cool-down")
	}
	n.clock.advance(2 * time.Second)
	if n.r.Penalised(rg.ID()) {
		t.Fatal("the penalty outlasted the cool-down")
	}
	if _, err := n.r.SyncWith(ctx, rg.ID()); err == nil || errors.Is(err, ErrPenalised) {
		t.Fatalf("pull after the cool-down: %v", err)
	}
	if got := rg.opens.Load(); got != 2 {
		t.Fatalf("the rogue saw %d streams, want 2", got)
	}
	wantRejected(t, n.r, map[string]int64{"bad_signature": 2, "sync_penalised": 2, "sync_penalty_refused": 1})
}

// TestServeSyncMalformed: every malformed stream a puller opens is
// counted; those that break the protocol (not merely cut short) penalise
// the puller.
func TestServeSyncMalformed(t *testing.T) {
	frame := func(body []byte) []byte { return append(binary.AppendUvarint(nil, uint64(len(body))), body...) }
	for _, tc := range []struct {
		name      string
		send      []byte
		penalised bool
	}{
		{"bad length prefix", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, true},
		{"non-minimal length prefix", []byte{0x80, 0x00}, true},
		{"oversized declaration", binary.AppendUvarint(nil, MaxSyncMessage+1), true},
		{"undecodable request", frame([]byte("garbage")), true},
		{"a response for a request", frame(EncodeResponse(SyncResponse{})), true},
		{"the same node probed twice", frame(EncodeRequest(SyncRequest{Probes: []Probe{{}, {}}})), true},
		{"a node probed with its ancestor", frame(EncodeRequest(SyncRequest{Probes: []Probe{{}, {Node: NodeRef{Depth: 1}}}})), true},
		// Before the first whole request: a stall, not penalised from
		// a peer that counts (everyone, with no trust list).
		{"cut short", append(binary.AppendUvarint(nil, 100), make([]byte, 10)...), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNet(t)
			h := n.peer(t)
			s, err := h.NewStream(context.Background(), n.h.ID(), SyncProtocol)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			s.CloseWrite()
			if b, err := readFrame(bufio.NewReader(s)); err == nil {
				t.Fatalf("served %d bytes", len(b))
			}
			want := map[string]int64{"sync_stalled": 1}
			if tc.penalised {
				want = map[string]int64{"sync_malformed": 1, "sync_penalised": 1}
			}
			waitRejected(t, n.r, want)
			if got := n.r.Penalised(h.ID()); got != tc.penalised {
				t.Fatalf("Penalised = %v, want %v", got, tc.penalised)
			}
		})
	}
}

// TestSyncWarningsRateLimited: repeated bad streams from one peer log one
// warning a minute; the rest are counted.
func TestSyncWarningsRateLimited(t *testing.T) {
	n := newTestNet(t)
	h := n.peer(t)
	cutShort := func() {
		t.Helper()
		s, err := h.NewStream(context.Background(), n.h.ID(), SyncProtocol)
		if err != nil {
			t.Fatal(err)
		}
		s.Write(append(binary.AppendUvarint(nil, 100), make([]byte, 10)...))
		s.CloseWrite()
		readFrame(bufio.NewReader(s))
	}
	for range 3 {
		cutShort()
	}
	waitRejected(t, n.r, map[string]int64{"sync_stalled": 3, "sync_warnings_suppressed": 2})
	waitFor(t, func() bool { got, _ := n.logs.count(h.ID()); return got >= 1 })
	if got, _ := n.logs.count(h.ID()); got != 1 {
		t.Fatalf("%d warnings for the peer, want 1", got)
	}
	n.clock.advance(time.Minute)
	cutShort()
	waitRejected(t, n.r, map[string]int64{"sync_stalled": 4, "sync_warnings_suppressed": 2})
	waitFor(t, func() bool { got, _ := n.logs.count(h.ID()); return got >= 2 })
	if got, suppressed := n.logs.count(h.ID()); got != 2 || suppressed != 2 {
		t.Fatalf("after a minute: %d warnings for the peer, the last saying %d suppressed; want 2, 2", got, suppressed)
	}
}

// TestServeSyncMemoryBounded: 128 sync streams that each declare a 4 MiB
// message, send 3 bytes of it and hold, cost far less than 128 × 4 MiB,
// and all but the pulls served at once are refused and counted.
func TestServeSyncMemoryBounded(t *testing.T) {
	const peers, streamsEach = 8, 16
	n := startTestNet(t, &testNet{mn: mocknet.New(), firstRequest: time.Hour}) // held, not stalled
	hosts := make([]host.Host, peers)
	for i := range hosts {
		hosts[i] = n.peer(t)
	}
	var streams []network.Stream
	t.Cleanup(func() {
		for _, s := range streams {
			s.Reset()
		}
	})
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, h := range hosts {
		for range streamsEach {
			s, err := h.NewStream(context.Background(), n.h.ID(), SyncProtocol)
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, s)
			if _, err := s.Write(append(binary.AppendUvarint(nil, MaxSyncMessage), "abc"...)); err != nil {
				t.Fatal(err)
			}
		}
	}
	refused := int64(peers*streamsEach - maxServing)
	waitFor(t, func() bool { return n.r.Rejected()["sync_busy"] == refused && servingNow(n.r) == maxServing })
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d streams declaring %d MiB each: heap grew %.1f MiB", len(streams), MaxSyncMessage>>20, float64(grew)/(1<<20))
	if grew > 64<<20 {
		t.Errorf("heap grew %d MiB, want under 64 MiB", grew>>20)
	}
	wantRejected(t, n.r, map[string]int64{"sync_busy": refused})
}

func servingNow(r *Replica) int { return r.serving.InUse() }

// TestSyncBuffersReserved: a sync stream's buffers are reserved on its
// resource scope, so a real host's resource manager refuses a message
// bigger than its limits allow; the pull is refused and counted as busy,
// and the peer, which did nothing wrong, is not penalised.
func TestSyncBuffersReserved(t *testing.T) {
	newHost := func(rm network.ResourceManager) host.Host {
		t.Helper()
		opts := []libp2p.Option{libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay()}
		if rm != nil {
			opts = append(opts, libp2p.ResourceManager(rm))
		}
		h, err := libp2p.New(opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h
	}
	const limit = 1 << 20
	limits := rcmgr.PartialLimitConfig{
		ProtocolPeer: map[protocol.ID]rcmgr.ResourceLimits{SyncProtocol: {Memory: limit}},
	}.Build(rcmgr.DefaultLimits.AutoScale())
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(limits))
	if err != nil {
		t.Fatal(err)
	}
	n := &testNet{}
	n.start(t, newHost(rm))
	h := newHost(nil)
	ctx := context.Background()
	if err := h.Connect(ctx, peer.AddrInfo{ID: n.h.ID(), Addrs: n.h.Addrs()}); err != nil {
		t.Fatal(err)
	}
	s, err := h.NewStream(ctx, n.h.ID(), SyncProtocol)
	if err != nil {
		t.Fatal(err)
	}
	// A well-formed request of 1 MiB: 131,071 wants.
	// The replica may reset the stream before it is all written.
	WriteMsg(s, EncodeRequest(SyncRequest{Want: make([]uint64, (limit-8)/8)}))
	if b, err := readFrame(bufio.NewReader(s)); err == nil {
		t.Fatalf("served %d bytes past the resource manager's limit", len(b))
	}
	waitRejected(t, n.r, map[string]int64{"sync_busy": 1})
	if n.r.Penalised(h.ID()) {
		t.Fatal("a peer was penalised for the resource manager's limit")
	}
}

// An honest peer may hold entries this node refuses for reasons of its
// own (a key kind of a newer version, a trust list being rolled out, a
// clock ahead): a pull skips and counts them, up to maxDisagreements, and
// then ends; the peer is never penalised for them.
func TestSyncSkipsWhatAnHonestPeerMayHold(t *testing.T) {
	n := newTestNet(t)
	rg := newRogue(t, n)
	s, err := Sign(Entry{Key: "nodes/" + rg.ID().String(), Value: []byte(`{}`), HLC: MakeHLC(t0.Add(time.Hour).UnixMilli(), 0)},
		rg.Peerstore().PrivKey(rg.ID()))
	if err != nil {
		t.Fatal(err)
	}
	items := fakeItems(maxDisagreements + 10)
	rg.serve(func(st network.Stream, round int, req SyncRequest) bool {
		if round == 1 {
			return respond(st, SyncResponse{Nodes: []NodeReply{{Items: items}}})
		}
		return respond(st, SyncResponse{Served: len(req.Want), Entries: repeat(s.Raw, len(req.Want))})
	})
	st, err := n.r.SyncWith(context.Background(), rg.ID())
	if !errors.Is(err, errDisagreed) || st.Disagreed != maxDisagreements {
		t.Fatalf("pull: %v after %d skipped, want errDisagreed after %d", err, st.Disagreed, maxDisagreements)
	}
	wantRejected(t, n.r, map[string]int64{"from_future": maxDisagreements + 1})
	want := SyncTotals{Pulls: 1, Failed: 1, Rounds: int64(st.Rounds), Sent: int64(st.Sent), Recv: int64(st.Recv),
		Fetched: int64(st.Fetched), Applied: int64(st.Applied)}
	if got := n.r.SyncTotals(); got != want || got.Recv == 0 || got.Fetched == 0 {
		t.Errorf("SyncTotals %+v, want the pull's own stats %+v, bytes and entries received", got, want)
	}
	if n.r.Penalised(rg.ID()) {
		t.Fatal("a peer was penalised for entries an honest peer may hold")
	}
}

// A replica whose first peer joins the topic pulls again every joinPull
// until, at least unsentDelay after the join, a pull brings nothing new.
func TestPullsWhileJoining(t *testing.T) {
	a := newTestNet(t)
	b := &testNet{mn: a.mn}
	hb, err := genPeer(a.mn)
	if err != nil {
		t.Fatal(err)
	}
	b.start(t, hb)
	if _, err := a.mn.LinkPeers(a.h.ID(), hb.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := a.mn.ConnectPeers(a.h.ID(), hb.ID()); err != nil {
		t.Fatal(err)
	}
	// The pull on join, then pulls that bring nothing but come before
	// unsentDelay has passed on a's clock (the test's, which stands still).
	waitFor(t, func() bool { return a.r.SyncTotals().Pulls >= 4 })
	a.clock.advance(unsentDelay)
	// The next pull is the last.
	last, since := a.r.SyncTotals().Pulls, time.Now()
	for time.Since(since) < 4*joinPull {
		if p := a.r.SyncTotals().Pulls; p != last {
			last, since = p, time.Now()
		}
		if last > maxJoinPulls {
			t.Fatalf("%d pulls: the replica kept pulling after a pull brought nothing new past unsentDelay", last)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := a.r.SyncTotals(); st.Failed > 0 {
		t.Errorf("%d of %d pulls failed", st.Failed, st.Pulls)
	}
}

// TestPullOnePerPeerInFlight: a peer that subscribes to the state topic
// again and again (a topic join each time) and never answers a pull is
// pulled from once at a time: each join while that pull is in flight is
// skipped and counted, not one more stream held open.
func TestPullOnePerPeerInFlight(t *testing.T) {
	const toggles = 20
	n := newTestNet(t)
	h, err := genPeer(n.mn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ps, err := pubsub.NewGossipSub(ctx, h, PubSubOptions(n.r.cfg.Topic)...)
	if err != nil {
		t.Fatal(err)
	}
	topic, err := ps.Join(n.r.cfg.Topic)
	if err != nil {
		t.Fatal(err)
	}
	var opens, open, most atomic.Int32
	h.SetStreamHandler(SyncProtocol, func(s network.Stream) {
		opens.Add(1)
		now := open.Add(1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		defer open.Add(-1)
		io.Copy(io.Discard, s) // never answers: held until the puller gives up
	})
	// As if the replica had joined long ago: no pulls while joining, only
	// the topic joins' own.
	n.r.meshSince.Store(1)
	if _, err := n.mn.LinkPeers(h.ID(), n.h.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := n.mn.ConnectPeers(h.ID(), n.h.ID()); err != nil {
		t.Fatal(err)
	}
	inTopic := func() bool { return slices.Contains(n.r.TopicPeers(), h.ID()) }
	for i := range toggles {
		sub, err := topic.Subscribe()
		if err != nil {
			t.Fatal(err)
		}
		// The join is acted on (a pull, or one skipped) before the leave.
		waitFor(t, func() bool { return int64(opens.Load())+n.r.Rejected()["sync_pulls_skipped"] == int64(i+1) })
		sub.Cancel()
		waitFor(t, func() bool { return !inTopic() })
		if t.Failed() {
			t.Fatalf("toggle %d: %d pulls opened, %d skipped", i, opens.Load(), n.r.Rejected()["sync_pulls_skipped"])
		}
	}
	if got, max := opens.Load(), most.Load(); got != 1 || max != 1 {
		t.Fatalf("%d topic joins: %d pulls opened, %d at once; want 1", toggles, got, max)
	}
	wantRejected(t, n.r, map[string]int64{"sync_pulls_skipped": toggles - 1})
}

// TestSyncSlotsKeptForPeersThatCount: peers that do not count, however
// many, hold at most the slots not kept for those that do: 8 of them
// holding 2 streams each, open and silent, leave a pull from a trusted
// writer served.
func TestSyncSlotsKeptForPeersThatCount(t *testing.T) {
	mn := mocknet.New()
	hm, err := genPeer(mn)
	if err != nil {
		t.Fatal(err)
	}
	// Held, not stalled: this test is about the slots alone.
	n := startTestNet(t, &testNet{mn: mn, trust: []peer.ID{hm.ID()}, firstRequest: time.Hour})
	m := &testNet{mn: mn}
	m.start(t, hm)
	n.connect(t, hm)
	const strangers = 8
	for range strangers {
		h := n.peer(t)
		for range maxServingPerPeer {
			s, err := h.NewStream(context.Background(), n.h.ID(), SyncProtocol)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Reset()
			s.Write([]byte{0x81}) // a length prefix begun, then nothing
		}
	}
	busy := int64(strangers*maxServingPerPeer - (maxServing - servingReserved))
	waitFor(t, func() bool { return n.r.Rejected()["sync_busy"] == busy })
	if _, err := m.r.SyncWith(context.Background(), n.h.ID()); err != nil {
		t.Fatalf("a trusted writer's pull while %d strangers hold streams: %v", strangers, err)
	}
	wantRejected(t, n.r, map[string]int64{"sync_busy": busy})
}

// TestSyncStall: a stream that brings no whole first request within
// firstRequest is reset and counted, and frees its slot; its peer is put
// in a cool-down of stallCooldown if it does not count, and only counted
// if it does. Past its first request a stream of a peer that counts
// keeps the longer deadline; one of a peer that does not must read each
// answer and bring the next request within nextRequest, or it stalled
// too.
func TestSyncStall(t *testing.T) {
	const first = 100 * time.Millisecond
	mn := mocknet.New()
	trusted, err := genPeer(mn)
	if err != nil {
		t.Fatal(err)
	}
	n := startTestNet(t, &testNet{mn: mn, trust: []peer.ID{trusted.ID()}, firstRequest: first, nextRequest: first})
	n.connect(t, trusted)
	stranger := n.peer(t)
	stall := func(h host.Host, want map[string]int64) {
		t.Helper()
		s, err := h.NewStream(context.Background(), n.h.ID(), SyncProtocol)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Reset()
		s.Write([]byte{0x81})
		waitRejected(t, n.r, want)
		if t.Failed() {
			t.FailNow()
		}
		if b, err := readFrame(bufio.NewReader(s)); err == nil {
			t.Fatalf("a stalled stream was served %d bytes", len(b))
		}
	}
	stall(stranger, map[string]int64{"sync_stalled": 1, "sync_penalised": 1})
	waitFor(t, func() bool { return servingNow(n.r) == 0 })
	if !n.r.Penalised(stranger.ID()) {
		t.Fatal("a stranger that stalled a stream is not cooling down")
	}
	n.clock.advance(stallCooldown)
	if n.r.Penalised(stranger.ID()) {
		t.Fatal("a stall's cool-down outlasted stallCooldown")
	}
	stall(trusted, map[string]int64{"sync_stalled": 2, "sync_penalised": 1})
	if n.r.Penalised(trusted.ID()) {
		t.Fatal("a trusted writer was penalised for a stall")
	}

	s, err := trusted.NewStream(context.Background(), n.h.ID(), SyncProtocol)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	br := bufio.NewReader(s)
	for round := range 2 {
		if round > 0 {
			time.Sleep(3 * first) // past the first and next requests' waits
		}
		if err := WriteMsg(s, EncodeRequest(SyncRequest{Probes: []Probe{{Hash: uint64(round + 1)}}})); err != nil {
			t.Fatal(err)
		}
		if _, err := readFrame(br); err != nil {
			t.Fatalf("round %d: %v", round+1, err)
		}
	}
	wantRejected(t, n.r, map[string]int64{"sync_stalled": 2, "sync_penalised": 1})
	s.Close()
	waitFor(t, func() bool { return servingNow(n.r) == 0 })

	// A stranger's pull whose second request does not come in time.
	n.clock.advance(stallCooldown)
	s2, err := stranger.NewStream(context.Background(), n.h.ID(), SyncProtocol)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Reset()
	br2 := bufio.NewReader(s2)
	if err := WriteMsg(s2, EncodeRequest(SyncRequest{Probes: []Probe{{Hash: 1}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := readFrame(br2); err != nil {
		t.Fatalf("a stranger's first round: %v", err)
	}
	waitRejected(t, n.r, map[string]int64{"sync_stalled": 3, "sync_penalised": 2})
	waitFor(t, func() bool { return servingNow(n.r) == 0 })
	if !n.r.Penalised(stranger.ID()) {
		t.Fatal("a stranger that idled between requests is not cooling down")
	}
	// A stranger that asks and does not read the answer (mocknet's
	// streams are pipes: the answer's write waits for the read).
	n.clock.advance(stallCooldown)
	s4, err := stranger.NewStream(context.Background(), n.h.ID(), SyncProtocol)
	if err != nil {
		t.Fatal(err)
	}
	defer s4.Reset()
	if err := WriteMsg(s4, EncodeRequest(SyncRequest{Probes: []Probe{{Hash: 1}}})); err != nil {
		t.Fatal(err)
	}
	waitRejected(t, n.r, map[string]int64{"sync_stalled": 4, "sync_penalised": 3})
	waitFor(t, func() bool { return servingNow(n.r) == 0 })

	// A stranger's pull that asks in time and then ends is no stall.
	n.clock.advance(stallCooldown)
	s3, err := stranger.NewStream(context.Background(), n.h.ID(), SyncProtocol)
	if err != nil {
		t.Fatal(err)
	}
	br3 := bufio.NewReader(s3)
	for round := range 2 {
		if err := WriteMsg(s3, EncodeRequest(SyncRequest{Probes: []Probe{{Hash: uint64(round + 1)}}})); err != nil {
			t.Fatal(err)
		}
		if _, err := readFrame(br3); err != nil {
			t.Fatalf("round %d: %v", round+1, err)
		}
	}
	s3.Close()
	waitFor(t, func() bool { return servingNow(n.r) == 0 })
	time.Sleep(2 * first)
	wantRejected(t, n.r, map[string]int64{"sync_stalled": 4, "sync_penalised": 3})
}

// TestRespondInChunks: the shell's response, made a chunk at a time
// under the lock, is State.Respond's, across chunks and when either
// budget runs out within one.
func TestRespondInChunks(t *testing.T) {
	n := newTestNet(t)
	n.r.mu.Lock()
	n.r.state = bigState(200_000, 300)
	n.r.mu.Unlock()
	var wants []uint64
	for i := range 5000 {
		wants = append(wants, keyHash(fmt.Sprintf("tribes/t%d", i*7)), uint64(i)) // held, and not
	}
	for _, req := range []SyncRequest{
		{Probes: probesAt(4), Want: wants}, // both budgets run out
		{Probes: probesAt(3)[:respondChunk+1], Want: wants[:respondChunk+1]},
		{Probes: probesAt(2)},
		{},
	} {
		want := n.r.state.Respond(req, respondBudget, Full)
		got := n.r.respond(req, Full, true)
		if len(want.Nodes) == 0 && len(req.Probes) > 0 {
			t.Fatal("no node replies: the test's state is wrong")
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%d probes, %d wants: %d replies, %d served, %d entries; want %d, %d, %d", len(req.Probes), len(req.Want),
				len(got.Nodes), got.Served, len(got.Entries), len(want.Nodes), want.Served, len(want.Entries))
		}
	}
}

// A peer holding more entries this node refuses for an honest reason than
// one pull skips (a revoked node's memberships, taken while it was
// admitted) does not keep the rest from this node: a pull remembers the
// versions it refused and later pulls do not ask for them again, so each
// pull gets further and the next ones get everything else. Without that,
// every pull ended at the 65th refusal, at the same place.
func TestRefusedVersionsDoNotBlockPulls(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	w, revoked := newAuthor(t, rng), newAuthor(t, rng)
	n, m := pairOf(t, &testNet{trust: []peer.ID{w.id}},
		&testNet{trust: []peer.ID{w.id}, counts: func(p peer.ID) bool { return p == w.id }}, true) // revoked counts no more
	now := n.clock.now()
	var es []*Signed
	for i := range 200 {
		es = append(es, revoked.write(t, now, fmt.Sprintf("tribes/t%d/members/%s/policy", i, revoked.id), "{}", false))
	}
	var keys []string
	for i := range 300 {
		e := w.write(t, now, fmt.Sprintf("tribes/w%d", i), "{}", false)
		es = append(es, e)
		keys = append(keys, e.Key)
	}
	n.r.applyRemote(es) // n took them while the author counted
	missing := func() int {
		k := 0
		for _, key := range keys {
			if _, ok := m.r.Get(key); !ok {
				k++
			}
		}
		return k
	}
	for i := 0; i < 8 && missing() > 0; i++ {
		m.r.SyncWith(context.Background(), n.h.ID()) // ends with errDisagreed while it meets 65 refusals
	}
	if k := missing(); k > 0 {
		t.Fatalf("%d of %d trusted entries never pulled", k, len(keys))
	}
	st, err := m.r.SyncWith(context.Background(), n.h.ID())
	if err != nil || st.Fetched != 0 || st.Skipped != 200 {
		t.Fatalf("a pull once all is here: %+v %v, want nothing fetched and the 200 refused skipped", st, err)
	}
}

// An entry whose value ReplicaConfig.Value refuses is refused on every
// path and counted value_refused; a pull skips it, as one an honest peer
// of an earlier version may hold, and does not ask for it again.
func TestValueRefused(t *testing.T) {
	m := &testNet{value: func(e *Signed) error {
		if strings.Contains(string(e.Value), "bad") {
			return errors.New("a bad value")
		}
		return nil
	}}
	n, m := pairOf(t, &testNet{}, m, true)
	ctx := context.Background()
	key := "nodes/" + n.h.ID().String()
	bad, err := n.r.PutQuiet(ctx, key, []byte(`{"name":"bad"}`))
	if err != nil {
		t.Fatal(err)
	}
	// Fetched once (by this pull, or by one of m's own that got there
	// first: the pair's topic joins pull too), then skipped.
	waitFor(t, func() bool {
		st, err := m.r.SyncWith(ctx, n.h.ID())
		return err == nil && st.Skipped == 1 && st.Fetched == 0
	})
	if got := m.r.Rejected()["value_refused"]; got != 1 {
		t.Fatalf("value_refused %d after the pulls, want 1: the version fetched once", got)
	}
	if err := n.r.Push(ctx, m.h.ID(), bad); err == nil {
		t.Error("the push was taken")
	}
	if got := m.r.Rejected()["value_refused"]; got != 2 {
		t.Errorf("value_refused %d, want 2 (a pull, a push)", got)
	}
	if _, ok := m.r.Get(key); ok {
		t.Error("a refused entry was stored")
	}
	// Remembered for a day, not for refusedFor: the value never changes.
	m.clock.advance(refusedFor + time.Minute)
	if st, err := m.r.SyncWith(ctx, n.h.ID()); err != nil || st.Skipped != 1 || st.Fetched != 0 {
		t.Fatalf("a pull past refusedFor: %+v %v, want the version still skipped", st, err)
	}
	if _, err := n.r.PutQuiet(ctx, key, []byte(`{"name":"good"}`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		m.r.SyncWith(ctx, n.h.ID())
		e, ok := m.r.Get(key)
		return ok && strings.Contains(string(e.Value), "good")
	})

	// More refused values than a pull's budget of disagreements do not
	// end it: what comes with them is pulled.
	for i := range 2 * maxDisagreements {
		if _, err := n.r.PutQuiet(ctx, fmt.Sprintf("tribes/t%03d", i), []byte(`"bad"`)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.r.PutQuiet(ctx, "tribes/zz", []byte(`"good"`)); err != nil {
		t.Fatal(err)
	}
	before := m.r.Rejected()["value_refused"]
	waitFor(t, func() bool { // one pull, or several if m's own pulls share the work
		if st, err := m.r.SyncWith(ctx, n.h.ID()); err != nil {
			t.Fatalf("a pull past %d refused values: %+v %v", maxDisagreements, st, err)
		}
		_, ok := m.r.Get("tribes/zz")
		return ok
	})
	if got := m.r.Rejected()["value_refused"] - before; got != 2*maxDisagreements {
		t.Errorf("%d values refused, want %d, each once", got, 2*maxDisagreements)
	}
}

// A peer may hold other keys of an author this node holds as many of as
// one may (Kind.MaxPerAuthor): one that counts can hand each node a set
// of its own. A pull skips and counts them, and does not ask for them
// again lately, but they do not end it: otherwise such an author's keys
// held by honest peers ended every pull before what came after them.
func TestPullPastAnAuthorsFullKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	x, w := newAuthor(t, rng), newAuthor(t, rng)
	n, m := pairOf(t, &testNet{}, &testNet{}, false)
	now := n.clock.now()
	membership := func(tribe string) *Signed {
		return x.write(t, now, fmt.Sprintf("tribes/%s/members/%s/policy", tribe, x.id), "{}", false)
	}
	var mine, theirs []*Signed
	for i := range MaxPolicyMemberships {
		mine = append(mine, membership(fmt.Sprintf("m%d", i)))
	}
	const others = 4 * maxDisagreements
	for i := range others {
		theirs = append(theirs, membership(fmt.Sprintf("n%d", i)))
	}
	var keys []string
	for i := range 50 {
		e := w.write(t, now, fmt.Sprintf("tribes/w%d", i), "{}", false)
		theirs = append(theirs, e)
		keys = append(keys, e.Key)
	}
	m.r.applyRemote(mine)
	n.r.applyRemote(theirs)
	ctx := context.Background()
	waitFor(t, func() bool { // one pull, or several if m's own pulls share the work
		if st, err := m.r.SyncWith(ctx, n.h.ID()); err != nil {
			t.Fatalf("a pull past %d keys of a full author: %+v %v", others, st, err)
		}
		for _, k := range keys {
			if _, ok := m.r.Get(k); !ok {
				return false
			}
		}
		return true
	})
	wantRejected(t, m.r, map[string]int64{"author_full": others}) // each once
	if st, err := m.r.SyncWith(ctx, n.h.ID()); err != nil || st.Fetched != 0 || st.Skipped != others {
		t.Fatalf("the next pull: %+v %v, want the %d refused skipped", st, err, others)
	}
}

// A pull asked for while every pull slot is taken waits for one, and is
// made: dropped (as it was), entries of the peers behind the bound
// waited for the periodic sync (a join storm on one seed took 4x longer
// to converge).
func TestPullsPastTheBoundWaitForASlot(t *testing.T) {
	ctx := context.Background()
	n := newTestNet(t)
	n.r.pulling.Max, n.r.pulling.Reserved = 1, 0
	n.r.meshSince.Store(1) // no pulls while joining: only the test's
	var peers []*testNet
	for range 3 {
		h, err := genPeer(n.mn)
		if err != nil {
			t.Fatal(err)
		}
		m := &testNet{mn: n.mn}
		m.start(t, h)
		n.connect(t, h)
		peers = append(peers, m)
	}
	idle := func() bool {
		n.r.mu.Lock()
		defer n.r.mu.Unlock()
		return n.r.pulling.InUse() == 0 && len(n.r.queue) == 0
	}
	waitFor(t, idle) // the topic joins' pulls
	// The one slot taken (a late topic join's pull may hold it a moment):
	// the three pulls asked for wait, and are made once it is free.
	busy := peer.ID("busy")
	waitFor(t, func() bool { return n.r.startPull(busy) })
	var keys []string
	for _, m := range peers {
		e, err := m.r.PutQuiet(ctx, "nodes/"+m.h.ID().String(), []byte(`{"name":"x"}`))
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, e.Key)
	}
	for _, m := range peers {
		n.r.spawnPull(m.h.ID())
	}
	for _, k := range keys {
		if _, ok := n.r.Get(k); ok {
			t.Fatalf("%s pulled with no slot free", k)
		}
	}
	n.r.endPull(busy)
	waitFor(t, func() bool {
		for _, k := range keys {
			if _, ok := n.r.Get(k); !ok {
				return false
			}
		}
		return true
	})
	waitFor(t, idle)
}
