package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// fakeAgent is a Source and Checker whose answers the test sets.
type fakeAgent struct {
	mu        sync.Mutex
	snap      Snapshot
	snapshots int
	health    Health
	healthErr error
}

func (f *fakeAgent) Snapshot() Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snapshots++
	return f.snap
}

func (f *fakeAgent) Health(context.Context) (Health, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.health, f.healthErr
}

func (f *fakeAgent) set(change func(*fakeAgent)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// scrape GETs /metrics in the text format and parses it.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", "text/plain")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("Content-Type %q, want the text exposition format", ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value returns the value of name's series whose labels include want.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no metric %s", name)
	}
next:
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("no series %s%v", name, want)
	return 0
}

func TestCollectorReadsTheSourceAtScrapeTime(t *testing.T) {
	src := &fakeAgent{snap: Snapshot{
		ID: "12D3KooWtest", Name: "n1", Cluster: "tribe", Version: "1.2.3",
		Peers: 3, ProbeHealth: 2, ProbesLate: 21, Entries: 42, StoreCommits: 17,
		NodesByLiveness:     map[string]int{"alive": 4, "suspect": 1, "dead": 0},
		NodesByAdmission:    map[string]int{"admitted": 3, "pending": 2},
		Rejected:            map[string]int64{"bad_signature": 2, "call_unauthorized": 5},
		Dropped:             map[string]int64{"outbound_queue": 7},
		Pubsub:              Pubsub{Sent: map[string]int64{"rpc": 30, "ihave": 6}, Received: map[string]int64{"message": 11}, Duplicates: 5},
		Sync:                Sync{Pulls: 10, Failed: 1, Rounds: 14, BytesSent: 1000, BytesRecv: 5000, Fetched: 9, Applied: 8, Shared: 6, Relayed: 4, Relinks: 3, JoinRedials: 2},
		Plugins:             map[string]int{"loaded": 2, "error": 1},
		CallDialRetries:     13,
		CallsRelayed:        23,
		CallsRelayedAgain:   24,
		OrdersRun:           26,
		OrdersAnsweredAgain: 25,
		Probes:              map[string]int64{"ack": 90, "indirect": 4, "failed": 1},
		Claims:              map[string]int64{"suspect": 7, "confirm": 3, "alive": 8},
		Refutations:         2,
	}}
	m := New(src)
	h := m.Handler(src, quiet)
	if src.snapshots != 0 {
		t.Fatalf("the source was read %d times before any scrape", src.snapshots)
	}
	fams := scrape(t, h)
	if src.snapshots != 1 {
		t.Fatalf("one scrape read the source %d times, want once", src.snapshots)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
		typ    dto.MetricType
	}{
		{"tribe_info", map[string]string{"id": "12D3KooWtest", "name": "n1", "cluster": "tribe", "version": "1.2.3"}, 1, dto.MetricType_GAUGE},
		{"tribe_peers", nil, 3, dto.MetricType_GAUGE},
		{"tribe_swim_health", nil, 2, dto.MetricType_GAUGE},
		{"tribe_swim_probes_late_total", nil, 21, dto.MetricType_COUNTER},
		{"tribe_swim_probes_total", map[string]string{"result": "ack"}, 90, dto.MetricType_COUNTER},
		{"tribe_swim_probes_total", map[string]string{"result": "failed"}, 1, dto.MetricType_COUNTER},
		{"tribe_swim_claims_total", map[string]string{"claim": "confirm"}, 3, dto.MetricType_COUNTER},
		{"tribe_swim_claims_total", map[string]string{"claim": "alive"}, 8, dto.MetricType_COUNTER},
		{"tribe_swim_refutations_total", nil, 2, dto.MetricType_COUNTER},
		{"tribe_state_entries", nil, 42, dto.MetricType_GAUGE},
		{"tribe_store_commits_total", nil, 17, dto.MetricType_COUNTER},
		{"tribe_nodes", map[string]string{"liveness": "alive"}, 4, dto.MetricType_GAUGE},
		{"tribe_nodes", map[string]string{"liveness": "suspect"}, 1, dto.MetricType_GAUGE},
		{"tribe_nodes", map[string]string{"liveness": "dead"}, 0, dto.MetricType_GAUGE},
		{"tribe_nodes_by_admission", map[string]string{"admission": "pending"}, 2, dto.MetricType_GAUGE},
		{"tribe_rejected_total", map[string]string{"reason": "bad_signature"}, 2, dto.MetricType_COUNTER},
		{"tribe_rejected_total", map[string]string{"reason": "call_unauthorized"}, 5, dto.MetricType_COUNTER},
		{"tribe_pubsub_dropped_total", map[string]string{"queue": "outbound_queue"}, 7, dto.MetricType_COUNTER},
		{"tribe_pubsub_sent_total", map[string]string{"part": "rpc"}, 30, dto.MetricType_COUNTER},
		{"tribe_pubsub_sent_total", map[string]string{"part": "ihave"}, 6, dto.MetricType_COUNTER},
		{"tribe_pubsub_received_total", map[string]string{"part": "message"}, 11, dto.MetricType_COUNTER},
		{"tribe_pubsub_duplicates_total", nil, 5, dto.MetricType_COUNTER},
		{"tribe_sync_pulls_total", nil, 10, dto.MetricType_COUNTER},
		{"tribe_sync_pulls_failed_total", nil, 1, dto.MetricType_COUNTER},
		{"tribe_peer_relinks_total", nil, 3, dto.MetricType_COUNTER},
		{"tribe_join_redials_total", nil, 2, dto.MetricType_COUNTER},
		{"tribe_call_dial_retries_total", nil, 13, dto.MetricType_COUNTER},
		{"tribe_call_relayed_total", nil, 23, dto.MetricType_COUNTER},
		{"tribe_call_relayed_again_total", nil, 24, dto.MetricType_COUNTER},
		{"tribe_orders_run_total", nil, 26, dto.MetricType_COUNTER},
		{"tribe_orders_answered_again_total", nil, 25, dto.MetricType_COUNTER},
		{"tribe_sync_rounds_total", nil, 14, dto.MetricType_COUNTER},
		{"tribe_sync_bytes_total", map[string]string{"direction": "sent"}, 1000, dto.MetricType_COUNTER},
		{"tribe_sync_bytes_total", map[string]string{"direction": "received"}, 5000, dto.MetricType_COUNTER},
		{"tribe_sync_entries_fetched_total", nil, 9, dto.MetricType_COUNTER},
		{"tribe_sync_entries_shared_total", nil, 6, dto.MetricType_COUNTER},
		{"tribe_sync_entries_applied_total", nil, 8, dto.MetricType_COUNTER},
		{"tribe_sync_entries_relayed_total", nil, 4, dto.MetricType_COUNTER},
		{"tribe_plugins", map[string]string{"state": "error"}, 1, dto.MetricType_GAUGE},
	} {
		if got := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
		if typ := fams[c.name].GetType(); typ != c.typ {
			t.Errorf("%s is a %v, want a %v", c.name, typ, c.typ)
		}
	}
	for _, name := range []string{"go_goroutines", "go_memstats_heap_inuse_bytes", "process_resident_memory_bytes"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("no %s: the Go and process collectors are missing", name)
		}
	}

	// The next scrape sees the source as it is then.
	src.set(func(f *fakeAgent) {
		f.snap.Rejected = map[string]int64{"bad_signature": 3, "call_unauthorized": 5}
		f.snap.Peers = 0
	})
	fams = scrape(t, h)
	if got := value(t, fams, "tribe_rejected_total", map[string]string{"reason": "bad_signature"}); got != 3 {
		t.Errorf("after a refusal tribe_rejected_total{reason=bad_signature} = %v, want 3", got)
	}
	if got := value(t, fams, "tribe_peers", nil); got != 0 {
		t.Errorf("tribe_peers = %v after the peers left, want 0", got)
	}
}

func TestServedHistogram(t *testing.T) {
	src := &fakeAgent{}
	m := New(src)
	m.Served("echo", "", 300*time.Microsecond)
	m.Served("echo", "", 2*time.Millisecond)
	m.Served("exec", "timeout", 30*time.Second)
	fams := scrape(t, m.Handler(src, quiet))
	const name = "tribe_call_served_duration_seconds"
	if typ := fams[name].GetType(); typ != dto.MetricType_HISTOGRAM {
		t.Fatalf("%s is a %v, want a histogram", name, typ)
	}
	if got := value(t, fams, name, map[string]string{"plugin": "echo", "code": "ok"}); got != 2 {
		t.Errorf("echo ok calls = %v, want 2", got)
	}
	if got := value(t, fams, name, map[string]string{"plugin": "exec", "code": "timeout"}); got != 1 {
		t.Errorf("exec timeout calls = %v, want 1", got)
	}
	m.Called("", time.Millisecond)
	m.Called("gone", 6*time.Second)
	fams = scrape(t, m.Handler(src, quiet))
	for _, code := range []string{"ok", "gone"} {
		if got := value(t, fams, "tribe_call_duration_seconds", map[string]string{"code": code}); got != 1 {
			t.Errorf("calls made, %s: %v, want 1", code, got)
		}
	}
	// The 300 µs echo is under the first bound, the 2 ms one is not.
	for _, met := range fams[name].GetMetric() {
		if met.GetLabel()[0].GetValue() != "ok" {
			continue
		}
		b := met.GetHistogram().GetBucket()[0]
		if b.GetUpperBound() != ServedBuckets[0] || b.GetCumulativeCount() != 1 {
			t.Errorf("first bucket: le=%v count=%d, want le=%v count=1", b.GetUpperBound(), b.GetCumulativeCount(), ServedBuckets[0])
		}
	}
}

func TestHealthz(t *testing.T) {
	src := &fakeAgent{health: Health{ID: "12D3KooWtest", Name: "n1", Peers: 2, Entries: 9, Uptime: 1.5}}
	h := New(src).Handler(src, quiet)
	get := func() (int, map[string]any) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("healthz body %q: %v", rec.Body, err)
		}
		return rec.Code, body
	}
	code, body := get()
	if code != http.StatusOK || body["status"] != "ok" || body["peers"] != 2.0 || body["entries"] != 9.0 || body["name"] != "n1" {
		t.Fatalf("healthy: %d %v", code, body)
	}
	src.set(func(f *fakeAgent) { f.healthErr = errors.New("node: stopped") })
	code, body = get()
	if code != http.StatusServiceUnavailable || body["status"] != "unavailable" || body["error"] != "node: stopped" {
		t.Fatalf("unhealthy: %d %v", code, body)
	}

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/nope", nil))
	if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "GET /metrics") {
		t.Errorf("unknown path: %d %q", rec.Code, rec.Body)
	}
}

func TestCheckAddr(t *testing.T) {
	for _, c := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:9464", true},
		{"127.0.0.1:0", true},
		{":9464", true},
		{"[::1]:9464", true},
		{"localhost:9464", true},
		{"9464", false},
		{"127.0.0.1", false},
		{"127.0.0.1:http", false},
		{"127.0.0.1:70000", false},
		{"127.0.0.1:", false},
		{"", false},
	} {
		err := CheckAddr(c.addr)
		if (err == nil) != c.ok {
			t.Errorf("CheckAddr(%q) = %v, want ok=%v", c.addr, err, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "HOST:PORT") && !strings.Contains(err.Error(), "port") {
			t.Errorf("CheckAddr(%q) = %v: does not say what is wanted", c.addr, err)
		}
	}
}

func TestListenServesAndShutsDown(t *testing.T) {
	src := &fakeAgent{health: Health{Peers: 1}}
	s, err := Listen("127.0.0.1:0", New(src).Handler(src, quiet), quiet)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + s.Addr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz on %s: %s", s.Addr(), resp.Status)
	}
	if _, err := Listen(s.Addr(), http.NotFoundHandler(), quiet); err == nil || !strings.Contains(err.Error(), s.Addr()) {
		t.Errorf("a second listener on %s: %v, want an error naming the address", s.Addr(), err)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://" + s.Addr() + "/healthz"); err == nil {
		t.Errorf("%s still answers after Shutdown", s.Addr())
	}
}
