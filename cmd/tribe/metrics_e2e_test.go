package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrapeMetrics GETs http://addr/metrics as a Prometheus server would and
// parses the text exposition format.
func scrapeMetrics(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams
}

// series is the value of name's series with exactly these label values
// among its labels (a histogram's sample count), and whether there is one.
func series(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
next:
	for _, m := range fams[name].GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if got[labels[i]] != labels[i+1] {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// An agent started with --metrics-addr on port 0 shows the port it got in
// `tribe status`, answers /healthz, and serves /metrics in the text format;
// the rejected counter moves when a rogue peer publishes a malformed entry
// and one it may not write, and a served call lands in the histogram.
func TestMetricsEndToEnd(t *testing.T) {
	a := newAgent(t, "m1", "--metrics-addr", "127.0.0.1:0")
	a.start()
	addr := a.status().MetricsAddr
	if addr == "" || strings.HasSuffix(addr, ":0") {
		t.Fatalf("tribe status: metrics_addr %q, want the address with the port picked", addr)
	}
	if out, _, _ := tribe("status", "--data-dir", a.dir); !strings.Contains(out, "http://"+addr+"/metrics") {
		t.Errorf("tribe status does not show the metrics URL:\n%s", out)
	}

	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	var health struct {
		Status string `json:"status"`
		Name   string `json:"name"`
		Peers  int    `json:"peers"`
	}
	err = json.NewDecoder(resp.Body).Decode(&health)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || health.Status != "ok" || health.Name != "m1" {
		t.Fatalf("GET /healthz: %s %+v %v", resp.Status, health, err)
	}

	fams := scrapeMetrics(t, addr)
	if v, ok := series(fams, "tribe_info", "name", "m1", "cluster", "tribe"); !ok || v != 1 {
		t.Errorf("tribe_info{name=m1}: %v %v", v, ok)
	}
	if v, _ := series(fams, "tribe_nodes", "liveness", "alive"); v != 1 {
		t.Errorf("tribe_nodes{liveness=alive} = %v, want 1 (itself)", v)
	}
	for _, reason := range []string{"malformed", "unauthorized"} {
		if v, ok := series(fams, "tribe_rejected_total", "reason", reason); !ok || v != 0 {
			t.Fatalf("tribe_rejected_total{reason=%s} before any refusal: %v %v, want 0", reason, v, ok)
		}
	}
	for _, name := range []string{"process_resident_memory_bytes", "go_goroutines", "libp2p_rcmgr_connections"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("no %s: the process, Go or libp2p resource manager metrics are missing", name)
		}
	}

	// A rogue libp2p peer publishes garbage and another node's record.
	r := newRogue(t, a.tcpJoin())
	if err := r.topic.Publish(context.Background(), []byte("not a signed entry")); err != nil {
		t.Fatal(err)
	}
	r.publish(t, "nodes/"+a.status().ID, `{"name":"impostor"}`)
	waitUntil(t, 30*time.Second, "the refusals in tribe_rejected_total", func() bool {
		fams := scrapeMetrics(t, addr)
		malformed, _ := series(fams, "tribe_rejected_total", "reason", "malformed")
		unauthorized, _ := series(fams, "tribe_rejected_total", "reason", "unauthorized")
		return malformed == 1 && unauthorized == 1
	})

	// A call this agent serves (to itself, through the same server) is
	// timed by plugin and outcome.
	for _, args := range [][]string{{"create", "t"}, {"join", "t", "m1"}, {"plugin", "load", "echo", "--tribe", "t"}} {
		if _, stderr, code := tribe(append(args, "--data-dir", a.dir)...); code != 0 {
			t.Fatalf("tribe %v: %s", args, stderr)
		}
	}
	waitUntil(t, 30*time.Second, "echo to load", func() bool { return a.loadedIn("t") == 1 })
	if _, stderr, code := tribe("call", "--node", "m1", "echo", "echo", `{"x":1}`, "--data-dir", a.dir); code != 0 {
		t.Fatalf("tribe call: %s", stderr)
	}
	fams = scrapeMetrics(t, addr)
	if v, _ := series(fams, "tribe_call_served_duration_seconds", "plugin", "echo", "code", "ok"); v != 1 {
		t.Errorf("tribe_call_served_duration_seconds{plugin=echo,code=ok} count = %v, want 1", v)
	}
	if v, _ := series(fams, "tribe_call_duration_seconds", "code", "ok"); v != 1 {
		t.Errorf("tribe_call_duration_seconds{code=ok} count = %v, want 1", v)
	}
	if v, _ := series(fams, "tribe_plugins", "state", "loaded"); v != 1 {
		t.Errorf("tribe_plugins{state=loaded} = %v, want 1", v)
	}
	// The rogue's two messages came in (what pubsub sends is counted
	// too: gossip's own test checks it).
	if v, _ := series(fams, "tribe_pubsub_received_total", "part", "message"); v < 2 {
		t.Errorf("tribe_pubsub_received_total{part=message} = %v, want at least the rogue's 2", v)
	}
	if _, ok := series(fams, "tribe_pubsub_sent_total", "part", "rpc"); !ok {
		t.Error("no tribe_pubsub_sent_total{part=rpc}")
	}
}

// A bad --metrics-addr is a usage error that says what is wanted.
func TestMetricsAddrRefused(t *testing.T) {
	for _, addr := range []string{"9464", "127.0.0.1:http", "127.0.0.1:99999"} {
		_, stderr, code := tribe("agent", "--data-dir", shortTempDir(t), "--no-mdns", "--metrics-addr", addr)
		if code != 2 || !strings.Contains(stderr, "metrics address \""+addr+"\"") {
			t.Errorf("--metrics-addr %s: exit %d, %q; want exit 2 naming the address", addr, code, stderr)
		}
	}
}
