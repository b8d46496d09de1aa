package node

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

func TestHelloRoundTrip(t *testing.T) {
	for _, want := range []helloMsg{
		{hello: hello{Name: "web-1", Cluster: "prod", Version: "1.2.3"}},
		{hello: hello{Name: "seed", Cluster: "prod", Busy: true}, Referrals: []string{
			"/ip4/10.0.0.7/tcp/4001/p2p/12D3KooWBA2ggpTuHnauMe577Uu5wE82CN3vjavGCYpFteWcZxgL"}},
	} {
		var buf bytes.Buffer
		if err := writeHello(&buf, want); err != nil {
			t.Fatal(err)
		}
		got, err := readHello(&buf)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("got %+v, %v; want %+v", got, err, want)
		}
	}
}

func TestReadHelloRefusesBadInput(t *testing.T) {
	cases := map[string]string{
		"not json":                   "hello\n",
		"no newline":                 `{"name":"a","cluster":"c"}`,
		"bad cluster":                `{"name":"a","cluster":"Bad Cluster"}` + "\n",
		"unknown field":              `{"name":"a","cluster":"c","x":1}` + "\n",
		"trailing data":              `{"name":"a","cluster":"c"}` + "\nmore",
		"a brace after the value":    `{"name":"a","cluster":"c"}}` + "\n",
		"oversized":                  `{"name":"` + strings.Repeat("a", maxHelloSize) + `","cluster":"c"}` + "\n",
		"long name":                  `{"name":"` + strings.Repeat("a", 65) + `","cluster":"c"}` + "\n",
		"escape in the name":         `{"name":"a\u001b[2K","cluster":"c"}` + "\n",
		"override in the version":    `{"name":"a","version":"\u202e1","cluster":"c"}` + "\n",
		"two objects":                `{"cluster":"c"}{"cluster":"c"}` + "\n",
		"empty":                      "",
		"only a newline":             "\n",
		"referrals, not busy":        `{"cluster":"c","referrals":["/ip4/10.0.0.7/tcp/4001/p2p/12D3KooWBA2ggpTuHnauMe577Uu5wE82CN3vjavGCYpFteWcZxgL"]}` + "\n",
		"referral without a peer ID": `{"cluster":"c","busy":true,"referrals":["/ip4/10.0.0.7/tcp/4001"]}` + "\n",
		"referral not an address":    `{"cluster":"c","busy":true,"referrals":["anywhere"]}` + "\n",
		"too many referrals": `{"cluster":"c","busy":true,"referrals":[` + strings.Repeat(`"/ip4/10.0.0.7/tcp/4001/p2p/12D3KooWBA2ggpTuHnauMe577Uu5wE82CN3vjavGCYpFteWcZxgL",`, maxReferrals) +
			`"/ip4/10.0.0.7/tcp/4001/p2p/12D3KooWBA2ggpTuHnauMe577Uu5wE82CN3vjavGCYpFteWcZxgL"]}` + "\n",
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := readHello(strings.NewReader(in)); !errors.Is(err, ErrBadHello) {
				t.Fatalf("err = %v, want ErrBadHello", err)
			}
		})
	}
}

// FuzzReadHello feeds arbitrary bytes from the network to the hello
// decoder: it must never panic, and whatever it accepts must be valid and
// survive a round trip.
func FuzzReadHello(f *testing.F) {
	f.Add([]byte(`{"name":"a","cluster":"tribe","version":"1"}` + "\n"))
	f.Add([]byte("\n"))
	f.Add([]byte(`{"cluster":"x"}` + "\n"))
	f.Add([]byte(`{"cluster":"x","busy":true,"referrals":["/ip4/10.0.0.7/tcp/4001/p2p/12D3KooWBA2ggpTuHnauMe577Uu5wE82CN3vjavGCYpFteWcZxgL"]}` + "\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := readHello(bytes.NewReader(b))
		if err != nil {
			return
		}
		if !clusterRE().MatchString(h.Cluster) || len(h.Name) > 64 || len(h.Referrals) > maxReferrals || (len(h.Referrals) > 0 && !h.Busy) {
			t.Fatalf("accepted an invalid hello %+v", h)
		}
		for _, r := range h.Referrals {
			if _, err := referral(r); err != nil {
				t.Fatalf("accepted a bad referral %q: %v", r, err)
			}
		}
		var buf bytes.Buffer
		writeHello(&buf, h)
		again, err := readHello(&buf)
		if err != nil || !reflect.DeepEqual(again, h) {
			t.Fatalf("round trip of %+v: %+v, %v", h, again, err)
		}
	})
}

// captureHandler keeps every record logged through it (and through loggers
// derived from it).
type captureHandler struct {
	mu   *sync.Mutex
	recs *[]slog.Record
}

func newCaptureHandler() captureHandler { return captureHandler{&sync.Mutex{}, &[]slog.Record{}} }

func (h captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h captureHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.recs = append(*h.recs, r.Clone())
	return nil
}
func (h captureHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h captureHandler) WithGroup(string) slog.Handler      { return h }

// warnings returns the messages of the WARN records that start with prefix.
func (h captureHandler) warnings(prefix string) []string { return h.at(slog.LevelWarn, prefix) }

// at returns the messages of the records at level that start with prefix.
func (h captureHandler) at(level slog.Level, prefix string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range *h.recs {
		if r.Level == level && strings.HasPrefix(r.Message, prefix) {
			out = append(out, r.Message)
		}
	}
	return out
}

// attr returns, as text, attribute key of the records at level whose
// message is msg.
func (h captureHandler) attr(level slog.Level, msg, key string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range *h.recs {
		if r.Level != level || r.Message != msg {
			continue
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == key {
				out = append(out, a.Value.String())
			}
			return true
		})
	}
	return out
}

// A peer sending bad hellos in a loop gets one warning a minute, the next
// saying how many were held back; the bad_hello counter counts every one.
func TestBadHellosAreWarnedOncePerPeerPerMinute(t *testing.T) {
	logs := newCaptureHandler()
	var offset atomic.Int64 // the test's clock runs ahead of the real one by this
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	n := startNodeDeps(t, loopbackConfig(t, "a"), Deps{Logger: slog.New(logs), Now: clock})

	h := bareHostConnectedTo(t, n)
	badHellos := func(k int) {
		t.Helper()
		for range k {
			s, err := h.NewStream(context.Background(), n.ID(), HelloProtocol)
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(s, "not a hello\n")
			io.Copy(io.Discard, s) // until the node resets the stream
			s.Close()
		}
	}
	badHellos(50)
	waitFor(t, "the node to count 50 bad hellos", func() bool { return n.badHello.Load() == 50 })
	if got := logs.warnings("hello:"); len(got) != 1 {
		t.Fatalf("50 bad hellos logged %d warnings, want 1: %q", len(got), got)
	}

	offset.Store(int64(time.Minute))
	badHellos(1)
	waitFor(t, "the node to count 51 bad hellos and warn again", func() bool {
		return n.badHello.Load() == 51 && len(logs.warnings("hello:")) >= 2
	})
	got := logs.warnings("hello:")
	if len(got) != 2 || !strings.HasSuffix(got[1], "(49 similar suppressed)") {
		t.Fatalf("a minute later: %q; want a second warning saying 49 were suppressed", got)
	}
}

func TestRestartedPeer(t *testing.T) {
	run1 := hello{Name: "w3", Cluster: "tribe", Version: "1", Boot: "aa"}
	run2 := run1
	run2.Boot = "bb"
	old := run1
	old.Boot = "" // an agent from before boot was said
	for _, c := range []struct {
		name     string
		old, now hello
		conns    int
		stranger bool
		want     bool
	}{
		{"a new run, a connection to the old one left", run1, run2, 2, false, true},
		{"a stranger's new run", run1, run2, 2, true, false},
		{"a new run, the old connection gone", run1, run2, 1, false, false},
		{"the same run, a second connection", run1, run1, 2, false, false},
		{"no boot before", old, run2, 2, false, false},
		{"no boot now", run1, old, 2, false, false},
	} {
		if got := relinkFor(c.old, c.now, c.conns, !c.stranger); got != c.want {
			t.Errorf("%s: relinkFor = %v, want %v", c.name, got, c.want)
		}
	}
}

// Restarts seen while a peer's relink runs coalesce into one more relink
// after it, on the same goroutine: a peer saying a new boot in every hello
// gets no goroutine per hello.
func TestRelinksOfOnePeerCoalesce(t *testing.T) {
	n := startNode(t, loopbackConfig(t, "a"))
	p := identity(t, loopbackConfig(t, "b")) // not connected: each relink closes nothing and fails to dial
	for range 5 {
		n.relinkSoon(p)
	}
	waitFor(t, "the relinks to end", func() bool {
		n.relinkMu.Lock()
		defer n.relinkMu.Unlock()
		return len(n.relinking) == 0
	})
	if got := n.relinks.Load(); got != 2 {
		t.Fatalf("%d relinks for 5 restarts seen during the first, want 2", got)
	}
}

// A hello cut short by a reset (the peer's connection closing under it,
// as a connection opened for one probe and released) is not a bad hello:
// only bytes that break the protocol are counted, an end of stream in the
// middle of a message included.
func TestHelloCutShortIsNotBad(t *testing.T) {
	logs := newCaptureHandler()
	n := startNodeDeps(t, loopbackConfig(t, "a"), Deps{Logger: slog.New(logs)})
	h := bareHostConnectedTo(t, n)
	half := func(end func(network.Stream) error) {
		t.Helper()
		s, err := h.NewStream(context.Background(), n.ID(), HelloProtocol)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(s, `{"cluster":"tribe","na`)
		// Once the node reads it: a stream reset before that never
		// reaches the handler.
		waitFor(t, "the node to take the hello stream", func() bool { return streamsWith(n, h.ID(), HelloProtocol) == 1 })
		end(s)
		waitFor(t, "the node to end the hello stream", func() bool { return streamsWith(n, h.ID(), HelloProtocol) == 0 })
	}
	for range 5 {
		half(network.Stream.Reset)
	}
	// Then one that ends mid-message, cleanly: the peer's doing.
	half(network.Stream.CloseWrite)
	if got := len(logs.at(slog.LevelDebug, "hello: cut short")); got != 5 {
		t.Fatalf("hellos cut short logged: %d, want 5", got)
	}
	if got := n.badHello.Load(); got != 1 {
		t.Fatalf("bad hellos counted: %d, want 1 (five resets are not bad hellos)", got)
	}
}

// bareHostConnectedTo is a libp2p host of its own (no tribe protocols),
// connected to n and closed when the test ends.
func bareHostConnectedTo(t *testing.T, n *Node) host.Host {
	t.Helper()
	h := listeningHost(t)
	if err := h.Connect(context.Background(), peer.AddrInfo{ID: n.ID(), Addrs: n.Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
	return h
}

// streamsWith counts the streams of protocol proto n holds with p.
func streamsWith(n *Node, p peer.ID, proto protocol.ID) int {
	k := 0
	for _, c := range n.Host().Network().ConnsToPeer(p) {
		for _, st := range c.GetStreams() {
			if st.Protocol() == proto {
				k++
			}
		}
	}
	return k
}

// A peer serves at most helloPerPeer hellos of one peer at once, and
// helloServing − helloReserved of peers that do not count; more are reset
// as they open and counted (hello_busy). Each waits helloTimeout for its
// message: a stranger's silent streams, as many as libp2p let through,
// held the streams every other protocol needs.
func TestHellosServedAtOnceAreBounded(t *testing.T) {
	admin, stranger := adminAndStranger(t)
	var reset atomic.Int64
	for range helloPerPeer + 6 {
		s, err := stranger.host.NewStream(t.Context(), admin.ID(), HelloProtocol)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Reset() })
		s.Write([]byte("{"))
		go func() {
			if _, err := s.Read(make([]byte, 1)); errors.Is(err, network.ErrReset) {
				reset.Add(1)
			}
		}()
	}
	// Before helloTimeout, which would end them all.
	for deadline := time.Now().Add(helloTimeout / 2); reset.Load() != 6; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the stranger's hellos reset as they opened, want 6", reset.Load())
		}
	}
	if st, _ := admin.Status(t.Context()); st.Rejected["hello_busy"] != 6 {
		t.Errorf("hello_busy %d, want 6", st.Rejected["hello_busy"])
	}
}
