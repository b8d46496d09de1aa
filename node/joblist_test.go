package node

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node/api"
)

// FuzzDecodeJobListRequest: a list request is any admitted peer's bytes.
func FuzzDecodeJobListRequest(f *testing.F) {
	f.Add([]byte(`{"tribe":""}` + "\n"))
	f.Add([]byte(`{"tribe":"web"}`))
	f.Add([]byte(`{"tribe":"../x"}`))
	f.Add([]byte(`{"tribe":"web","x":1}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tribe, err := decodeJobListRequest(b)
		if err == nil && tribe != "" && !gossip.ValidName(tribe) {
			t.Fatalf("accepted %q as tribe %q", b, tribe)
		}
	})
}

// FuzzDecodeJobListAnswer: an answer is a writer's bytes, read by a node
// that trusts the writer's word on the acks but not its encoding.
func FuzzDecodeJobListAnswer(f *testing.F) {
	f.Add([]byte(`{"jobs":[{"id":"19ab3c5e2f1-a1b2c3d4","state":"done","plugin":"echo","method":"echo","counts":{"done":2}}]}`))
	f.Add([]byte(`{"error":"no"}`))
	f.Add([]byte(`{"jobs":[{"id":"../x","state":"done"}]}`))
	f.Add([]byte(`{"jobs":[{"id":"a","state":"maybe"}]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		list, err := decodeJobListAnswer(b)
		if err != nil {
			return
		}
		if list == nil {
			t.Fatal("a nil list without an error")
		}
		for _, j := range list {
			if !gossip.ValidName(j.ID) || !strings.Contains(" pending done failed ", " "+j.State+" ") {
				t.Fatalf("accepted %q: job %q in state %q", b, j.ID, j.State)
			}
		}
	})
}

// A node that is not a trusted writer lists jobs as the writer holds
// them, asking it, and is left holding no ack of other nodes; with a
// writer of an earlier version (no list protocol) it pulls from the
// writer as it did, and lists the same.
func TestJobListAskedOfAWriter(t *testing.T) {
	ctx := context.Background()
	a, b, c, d, j := trustedJobDone(t)
	acksOn := func(n *Node) int {
		k := 0
		for _, e := range n.replica.Prefix(jobsPrefix) {
			if strings.Contains(e.Key, "/acks/") {
				k++
			}
		}
		return k
	}
	want := func(n *Node) {
		t.Helper()
		list, err := n.Jobs(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 1 || list[0].ID != j.ID || list[0].State != "done" || list[0].Counts["done"] != 2 {
			t.Fatalf("%s lists %+v", n.cfg.Name, list)
		}
		if list, err := n.Jobs(ctx, "other"); err != nil || len(list) != 0 {
			t.Fatalf("%s lists of another tribe %+v %v", n.cfg.Name, list, err)
		}
	}
	want(d)
	if k := acksOn(d); k != 0 {
		t.Fatalf("d holds %d acks after listing", k)
	}
	want(b)
	if k := acksOn(b); k != 1 {
		t.Fatalf("b holds %d acks after listing, want its own", k)
	}

	a.host.RemoveStreamHandler(JobListProtocol) // as an earlier version
	want(c)
	if k := acksOn(c); k != 2 {
		t.Fatalf("c holds %d acks after a pull from the writer, want both", k)
	}
}

// A list is served to admitted nodes only; a malformed request is refused
// with the reason; both are counted. Asked by a node that is not
// admitted, `job list` says why, and pulls nothing.
func TestJobListRefusesOutsiders(t *testing.T) {
	a, nodes := trustedFleet(t, "b")
	sc := loopbackConfig(t, "stranger")
	sc.Trusted, sc.Join = a.cfg.Trusted, []string{tcpAddr(a)}
	stranger := startNode(t, sc)
	waitFor(t, "the stranger to connect", func() bool { return len(stranger.ConnectedPeers()) > 0 })
	for _, c := range []struct {
		from      *Node
		req, want string
	}{
		{stranger, `{"tribe":""}`, "not admitted"},
		{nodes["b"], `{"tribe":"../x"}`, "not a tribe name"},
	} {
		s, err := c.from.host.NewStream(context.Background(), a.ID(), JobListProtocol)
		if err != nil {
			t.Fatal(err)
		}
		s.Write([]byte(c.req + "\n"))
		var answer struct{ Error string }
		json.NewDecoder(s).Decode(&answer)
		s.Close()
		if !strings.Contains(answer.Error, c.want) {
			t.Errorf("%s from %s: %q, want it to say %q", c.req, c.from.cfg.Name, answer.Error, c.want)
		}
	}
	if got := a.jobs.listRefused.Load(); got != 2 {
		t.Errorf("%d refused list requests counted, want 2", got)
	}
	if _, err := stranger.Jobs(context.Background(), ""); err == nil || !strings.Contains(err.Error(), "not admitted") {
		t.Errorf("the stranger listing: %v", err)
	}
}

// A peer that opens a job list or output stream and sends nothing is cut
// off after firstRequestTimeout and counted as refused: it held its slot
// for the stream's whole requestTimeout, and four admitted peers doing so
// blocked every list.
func TestSilentJobRequestsAreCutOff(t *testing.T) {
	a, nodes := trustedFleet(t, "b")
	b := nodes["b"]
	for _, c := range []struct {
		proto    protocol.ID
		from, to *Node
		refused  *atomic.Int64
	}{
		{JobListProtocol, b, a, &a.jobs.listRefused},
		{JobOutputProtocol, a, b, &b.jobs.outputRefused},
	} {
		s, err := c.from.host.NewStream(context.Background(), c.to.ID(), c.proto)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		io.Copy(io.Discard, s) // until the server ends the stream
		took := time.Since(start)
		s.Reset()
		if took >= requestTimeout {
			t.Errorf("%s: a silent stream was held %v, past the first request's %v", c.proto, took, firstRequestTimeout)
		}
		waitFor(t, string(c.proto)+"'s silent stream counted as refused", func() bool { return c.refused.Load() == 1 })
	}
}

// A job's row in a list is made once and kept until the job or one of its
// acks changes: then the list shows the change.
func TestJobListRowsKeptUntilAChange(t *testing.T) {
	a, _, c, _, j := trustedJobDone(t)
	row := func() api.Job {
		t.Helper()
		list := a.localJobs("")
		if len(list) != 1 || list[0].ID != j.ID {
			t.Fatalf("list %+v", list)
		}
		return list[0]
	}
	if r := row(); r.State != "done" || r.Counts["done"] != 2 {
		t.Fatalf("row %+v, want done on 2", r)
	}
	made := a.jobs.viewsMade.Load()
	row()
	row()
	if got := a.jobs.viewsMade.Load() - made; got != 0 {
		t.Fatalf("the row was made %d times more with nothing changed", got)
	}
	if err := a.replica.Forget(ackKey(j.ID, c.ID())); err != nil {
		t.Fatal(err)
	}
	if r := row(); r.State != "pending" || r.Counts["done"] != 1 || r.Counts["pending"] != 1 {
		t.Fatalf("row after an ack went %+v, want pending on 1, done on 1", r)
	}
}

// A writer's refusal is its word; an answer that does not read as a list
// is a bad answer (counted by the asker, job_list_bad_answer).
func TestJobListAnswerRefusalOrBad(t *testing.T) {
	for in, bad := range map[string]bool{
		`{"error":"busy"}`: false,
		`not json`:         true,
		`{"jobs":[{"id":"../x","state":"done"}]}`: true,
		`{"jobs":[{"id":"a","state":"maybe"}]}`:   true,
	} {
		_, err := decodeJobListAnswer([]byte(in))
		if err == nil || errors.Is(err, errNotJobList) != bad {
			t.Errorf("%s: %v, want a bad answer %v", in, err, bad)
		}
	}
}
