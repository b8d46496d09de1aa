package node

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

func TestDecodeTaskWatchRequest(t *testing.T) {
	if tribe, name, err := decodeTaskWatchRequest([]byte(`{"task":"core/metrics"}` + "\n")); err != nil || tribe != "core" || name != "metrics" {
		t.Errorf("a good request: %q %q %v", tribe, name, err)
	}
	for _, bad := range []string{``, `{}`, `{"task":"core"}`, `{"task":"core/Bad Name"}`, `{"task":"core/m","x":1}`, `[1]`} {
		if _, _, err := decodeTaskWatchRequest([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// FuzzDecodeTaskWatchRequest: a watch request is a stranger's bytes.
func FuzzDecodeTaskWatchRequest(f *testing.F) {
	f.Add([]byte(`{"task":"core/metrics"}` + "\n"))
	f.Add([]byte(`{"task":"a/b","task":"c/d"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tribe, name, err := decodeTaskWatchRequest(b)
		if err == nil && (tribe == "" || name == "" || strings.Contains(name, "/")) {
			t.Fatalf("accepted %q as %q/%q", b, tribe, name)
		}
	})
}

// Only trusted writers and members may watch a tribe's task runs: a
// pending node's request is refused with the reason and counted.
func TestTaskWatchRefusesOutsiders(t *testing.T) {
	admin, stranger := adminAndStranger(t)
	s, err := stranger.host.NewStream(context.Background(), admin.ID(), TaskWatchProtocol)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Write([]byte(`{"task":"core/metrics"}` + "\n"))
	var answer struct{ Error string }
	if err := json.NewDecoder(s).Decode(&answer); err != nil || !strings.Contains(answer.Error, "may not watch") {
		t.Errorf("a pending node's watch: %+v, %v", answer, err)
	}
	if got := admin.tasks.watchRefused.Load(); got != 1 {
		t.Errorf("%d refused watches counted, want 1", got)
	}
}

// adminAndStranger starts a trusted writer and a node that trusts it but
// was never admitted, connected to it.
func adminAndStranger(t *testing.T) (admin, stranger *Node) {
	t.Helper()
	ca := loopbackConfig(t, "admin")
	adminID := identity(t, ca)
	ca.Trusted = []string{adminID.String()}
	admin = startNode(t, ca)
	c := loopbackConfig(t, "stranger")
	c.Trusted, c.Join = ca.Trusted, []string{tcpAddr(admin)}
	stranger = startNode(t, c)
	waitFor(t, "the stranger to connect", func() bool { return len(stranger.ConnectedPeers()) > 0 })
	return admin, stranger
}
