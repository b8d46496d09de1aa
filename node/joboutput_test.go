package node

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/tribeagent/tribe/gossip"
)

// FuzzDecodeJobOutputRequest: an output request is a stranger's bytes.
func FuzzDecodeJobOutputRequest(f *testing.F) {
	f.Add([]byte(`{"job":"19ab3c5e2f1-a1b2c3d4"}` + "\n"))
	f.Add([]byte(`{"job":"../etc/passwd"}`))
	f.Add([]byte(`{"job":"a","x":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := decodeJobOutputRequest(b)
		if err == nil && !gossip.ValidName(id) {
			t.Fatalf("accepted %q as job %q", b, id)
		}
	})
}

// Only trusted writers read a job's output: anyone else is refused with
// the reason and counted, and a malformed request too.
func TestJobOutputRefusesOutsiders(t *testing.T) {
	admin, stranger := adminAndStranger(t)
	for i, req := range []string{`{"job":"19ab-01"}`, `{"job":"../../x"}`} {
		s, err := stranger.host.NewStream(context.Background(), admin.ID(), JobOutputProtocol)
		if err != nil {
			t.Fatal(err)
		}
		s.Write([]byte(req + "\n"))
		var answer struct{ Error string }
		json.NewDecoder(s).Decode(&answer)
		s.Close()
		if want := []string{"not a trusted writer", "not a job id"}[i]; !strings.Contains(answer.Error, want) {
			t.Errorf("%s: %q, want it to say %q", req, answer.Error, want)
		}
	}
	if got := admin.jobs.outputRefused.Load(); got != 2 {
		t.Errorf("%d refused output requests counted, want 2", got)
	}
}
