package node

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
)

func TestRunServesMetricsAndHealth(t *testing.T) {
	c := loopbackConfig(t, "a")
	c.MetricsAddr = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan *Node, 1)
	go func() { done <- Run(ctx, c, Deps{Logger: testLogger(t)}, func(n *Node) { ready <- n }) }()
	var n *Node
	select {
	case n = <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	addr := n.MetricsAddr()
	if st, _ := n.Status(context.Background()); addr == "" || strings.HasSuffix(addr, ":0") || st.MetricsAddr != addr {
		t.Fatalf("metrics address %q, status says %q: want the port picked", addr, st.MetricsAddr)
	}
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %s", resp.Status)
	}
	snap := metricsSource{n}.Snapshot()
	if snap.NodesByLiveness[Alive] != 1 || snap.NodesByAdmission["open"] != 1 || snap.Entries == 0 || snap.ID != n.ID().String() {
		t.Fatalf("snapshot of a lone node: %+v", snap)
	}
	for _, k := range []string{"ack", "indirect", "failed"} {
		if _, ok := snap.Probes[k]; !ok {
			t.Fatalf("no probes_total{result=%q} series: %v", k, snap.Probes)
		}
	}
	for _, k := range []string{"alive", "suspect", "dead", "left", "confirm"} {
		if _, ok := snap.Claims[k]; !ok {
			t.Fatalf("no claims_total{claim=%q} series: %v", k, snap.Claims)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v", err)
	}
	if _, err := (metricsSource{n}).Health(context.Background()); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("health of a closed node: %v, want ErrNotRunning", err)
	}
	if _, err := http.Get("http://" + addr + "/healthz"); err == nil {
		t.Fatalf("%s still answers after Run returned", addr)
	}
}

// A metrics address that is taken stops the agent with an error naming
// it, and releases the data dir.
func TestRunRefusesATakenMetricsAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c := loopbackConfig(t, "a")
	c.MetricsAddr = ln.Addr().String()
	err = Run(context.Background(), c, Deps{Logger: testLogger(t)}, func(*Node) { t.Error("ready with a taken metrics address") })
	if err == nil || !strings.Contains(err.Error(), "metrics: listen on "+c.MetricsAddr) {
		t.Fatalf("Run: %v, want the listen error naming %s", err, c.MetricsAddr)
	}
	n, err := New(c, Deps{})
	if err != nil {
		t.Fatalf("the data dir is still held: %v", err)
	}
	n.Close()
}
