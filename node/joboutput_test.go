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
// the reason, before its request is read, and counted; a malformed
// request too.
func TestJobOutputRefusesOutsiders(t *testing.T) {
	admin, stranger := adminAndStranger(t)
	ask := func(from, to *Node, req string) string {
		t.Helper()
		s, err := from.host.NewStream(context.Background(), to.ID(), JobOutputProtocol)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Reset()
		s.Write([]byte(req))
		var answer struct{ Error string }
		json.NewDecoder(s).Decode(&answer)
		return answer.Error
	}
	// A request never ended: the stranger is refused without it.
	if got := ask(stranger, admin, `{"job":"19ab-01"}`); !strings.Contains(got, "not a trusted writer") {
		t.Errorf("a stranger's request: %q, want it to say it is not a trusted writer", got)
	}
	if got := ask(admin, stranger, `{"job":"../../x"}`+"\n"); !strings.Contains(got, "not a job id") {
		t.Errorf("a malformed request: %q, want it to say it is not a job id", got)
	}
	if got := admin.jobs.outputRefused.Load() + stranger.jobs.outputRefused.Load(); got != 2 {
		t.Errorf("%d refused output requests counted, want 2", got)
	}
}

// A target serves one output at a time to a peer: a second stream from
// it, while the first is open, is refused as busy and counted.
func TestJobOutputsServedOneAtATimeToAPeer(t *testing.T) {
	admin, target := adminAndStranger(t)
	answers := make(chan string, 2)
	for range 2 {
		s, err := admin.host.NewStream(context.Background(), target.ID(), JobOutputProtocol)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Reset()
		s.Write([]byte(`{"job":`)) // never ends: the first holds its slot
		go func() {
			var answer struct{ Error string }
			json.NewDecoder(s).Decode(&answer)
			answers <- answer.Error
		}()
	}
	if got := <-answers; !strings.Contains(got, "busy") {
		t.Errorf("the first answer: %q, want the second stream refused as busy", got)
	}
	if got := target.jobs.outputRefused.Load(); got != 1 {
		t.Errorf("%d refused output requests counted, want 1", got)
	}
}

// A request line is one JSON value and nothing more: what follows it on
// the line (another value, a stray '}', anything) is refused, as the
// README says the requests are decoded strictly.
func TestJobRequestsRefuseDataAfterTheValue(t *testing.T) {
	for _, tail := range []string{"", " ", "\r"} {
		if _, err := decodeJobOutputRequest([]byte(`{"job":"a"}` + tail + "\n")); err != nil {
			t.Errorf("output request ending %q: %v", tail, err)
		}
		if _, err := decodeJobListRequest([]byte(`{"tribe":"web"}` + tail + "\n")); err != nil {
			t.Errorf("list request ending %q: %v", tail, err)
		}
	}
	for _, tail := range []string{`{"job":"b"}`, `}`, `]`, ` x`, `"`} {
		if id, err := decodeJobOutputRequest([]byte(`{"job":"a"}` + tail + "\n")); err == nil {
			t.Errorf("output request followed by %q taken, for job %q", tail, id)
		}
		if tribe, err := decodeJobListRequest([]byte(`{"tribe":"web"}` + tail + "\n")); err == nil {
			t.Errorf("list request followed by %q taken, for tribe %q", tail, tribe)
		}
	}
}
