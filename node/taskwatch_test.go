package node

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins/tasks"
)

func TestDecodeTaskWatchRequest(t *testing.T) {
	if tribe, name, err := decodeTaskWatchRequest([]byte(`{"task":"core/metrics"}` + "\n")); err != nil || tribe != "core" || name != "metrics" {
		t.Errorf("a good request: %q %q %v", tribe, name, err)
	}
	for _, bad := range []string{``, `{}`, `{"task":"core"}`, `{"task":"core/Bad Name"}`, `{"task":"core/m","x":1}`, `[1]`, `{"task":"core/m"}}`, `{"task":"core/m"} {}`} {
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

// watchCluster starts a trusted writer and an admitted manual member, b,
// of tribe t, where the writer runs task e every second.
func watchCluster(t *testing.T) (admin, b *Node) {
	t.Helper()
	ctx := context.Background()
	admin, ns := trustedCluster(t, nil, "b")
	b = ns["b"]
	if _, err := admin.CreateTribe(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Admit(ctx, api.AdmitRequest{Nodes: []string{"b"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Join(ctx, "t", []string{"admin", "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.LoadPlugin(ctx, "echo", "t", api.LoadRequest{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "echo loaded", func() bool { return pluginStates(admin, "t")["admin"] == "loaded" })
	if _, err := admin.CreateTask(ctx, "t", api.TaskRequest{Manifest: "name: e\nschedule: {interval: 1s}\nworkflow: {collect: {plugin: echo, method: echo}}\n"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to count as a member", func() bool { return admin.mayWatch(b.ID(), "t") })
	return admin, b
}

// openWatch opens a watch of task from w on member m.
func openWatch(t *testing.T, w, m *Node, task string) (network.Stream, *bufio.Reader) {
	t.Helper()
	s, err := w.host.NewStream(context.Background(), m.ID(), TaskWatchProtocol)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Reset() })
	s.Write([]byte(`{"task":"` + task + `"}` + "\n"))
	return s, bufio.NewReader(s)
}

// A watcher that leaves the tribe and is revoked gets no run that ended
// after that: its watch ends with the reason, counted.
func TestTaskWatchEndsWhenTheWatcherMayNoLongerWatch(t *testing.T) {
	ctx := context.Background()
	admin, b := watchCluster(t)
	_, br := openWatch(t, b, admin, "t/e")
	var first api.TaskRun
	line, err := br.ReadBytes('\n')
	if err != nil || json.Unmarshal(line, &first) != nil || first.Run < 1 {
		t.Fatalf("first run: %q, %v", line, err)
	}
	if _, err := admin.Leave(ctx, "t", []string{"b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Revoke(ctx, []string{"b"}); err != nil {
		t.Fatal(err)
	}
	// Runs written before the revocation may still be in flight.
	last := admin.tasks.statuses()["t/e"].Runs
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			t.Fatalf("the watch ended without the reason: %v", err)
		}
		var got struct {
			api.TaskRun
			Error string `json:"error"`
		}
		json.Unmarshal(line, &got)
		if got.ID == "" {
			if !strings.Contains(got.Error, "may no longer watch") {
				t.Fatalf("the watch ended with %q", line)
			}
			break
		}
		if got.Run > last {
			t.Fatalf("run %d reached a revoked watcher (revoked after run %d)", got.Run, last)
		}
	}
	if got := admin.tasks.watchRefused.Load(); got != 1 {
		t.Errorf("%d refused watches counted, want 1", got)
	}
	waitFor(t, "the slot to be freed", func() bool {
		admin.tasks.watch.mu.Lock()
		defer admin.tasks.watch.mu.Unlock()
		return admin.tasks.watch.n == 0
	})
}

// A member that answers a watch with a line without end is cut off at
// taskRunLineMax, counted, not buffered by the watching agent.
func TestTaskWatchCutsOffAnOverlongRunLine(t *testing.T) {
	admin, b := watchCluster(t)
	b.host.SetStreamHandler(TaskWatchProtocol, func(s network.Stream) {
		defer s.Reset()
		bufio.NewReader(s).ReadSlice('\n')
		s.Write([]byte(`{"output":"`))
		chunk := []byte(strings.Repeat("x", 64<<10))
		for range 64 { // 4 MiB, or until the watcher resets the stream
			if _, err := s.Write(chunk); err != nil {
				return
			}
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- admin.WatchTask(ctx, "e", func(*api.TaskRun) {}) }()
	waitFor(t, "the overlong line to be cut off", func() bool { return admin.tasks.watchOverlong.Load() >= 1 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A run line holds at most the output's and the error's heads.
func TestTaskRunLineFitsItsLimit(t *testing.T) {
	n := startNode(t, loopbackConfig(t, "a"))
	worst := strings.Repeat("<", 4*maxOutputHead) // 6 bytes each escaped
	out, _ := json.Marshal(worst)
	ev := n.runEvent("t", strings.Repeat("n", 64), tasks.Status{Runs: 1}, out, errors.New(worst))
	line, _ := json.Marshal(ev)
	if len(line) >= taskRunLineMax {
		t.Errorf("a run line of %d bytes, the limit is %d", len(line), taskRunLineMax)
	}
}

// One peer holds at most maxTaskWatchesPerPeer watches; the network all
// of maxTaskWatchers, and this node's own API watches past them; a task
// nobody watches any more is forgotten.
func TestTaskWatchCaps(t *testing.T) {
	var w taskWatch
	type held struct {
		p  peer.ID
		ch chan api.TaskRun
	}
	var all []held
	for i := range maxTaskWatchers {
		p := peer.ID(fmt.Sprint("p", i/maxTaskWatchesPerPeer))
		ch, err := w.add(fmt.Sprint("t/e", i), p)
		if err != nil {
			t.Fatalf("watch %d of %s: %v", i, p, err)
		}
		all = append(all, held{p, ch})
	}
	if _, err := w.add("t/e", "other"); err == nil {
		t.Error("a watch past the network's cap was served")
	}
	local, err := w.add("t/e", "")
	if err != nil {
		t.Fatalf("the local API's watch was refused: %v", err)
	}
	w.remove("t/e", all[0].p, all[0].ch) // not its key: changes nothing
	w.remove("t/e0", all[0].p, all[0].ch)
	if _, err := w.add("t/e", all[maxTaskWatchesPerPeer].p); err == nil {
		t.Errorf("a fifth watch of one peer was served")
	}
	if _, err := w.add("t/e", all[0].p); err != nil {
		t.Errorf("a freed slot stays taken: %v", err)
	}
	w.remove("t/e", "", local)
	for i, h := range all[1:] {
		w.remove(fmt.Sprint("t/e", i+1), h.p, h.ch)
	}
	if w.n != 1 || len(w.byTask) != 1 || len(w.perPeer) != 1 {
		t.Errorf("after removing all but one: %d watches, %d tasks, %d peers", w.n, len(w.byTask), len(w.perPeer))
	}
}

// A watch of a task this node does not have is refused, counted.
func TestTaskWatchRefusesAnUnknownTask(t *testing.T) {
	admin, b := watchCluster(t)
	_, br := openWatch(t, b, admin, "t/nope")
	waitFor(t, "the watch to be refused", func() bool { return admin.tasks.watchRefused.Load() == 1 })
	var answer struct{ Error string }
	if line, err := br.ReadBytes('\n'); err != nil || json.Unmarshal(line, &answer) != nil || !strings.Contains(answer.Error, "no task t/nope") {
		t.Errorf("the answer: %q, %v", line, err)
	}
}

// A task's view gives each member the report in its own record, or
// pending when it has none.
func TestTaskViewGivesEachMemberItsReport(t *testing.T) {
	admin, b := watchCluster(t)
	waitFor(t, "the writer's report", func() bool {
		return admin.nodeRecords()[admin.ID()].Tasks["t/e"].Runs >= 1
	})
	// Records change as runs are reported: compared while they hold still.
	var records map[peer.ID]nodeRecord
	var task api.Task
	waitFor(t, "the records to hold still over a view", func() bool {
		before := admin.nodeRecords()
		var err error
		task, err = admin.Task(context.Background(), "e")
		if err != nil {
			t.Fatal(err)
		}
		records = admin.nodeRecords()
		return reflect.DeepEqual(before, records)
	})
	if len(task.Members) != 2 {
		t.Fatalf("the view: %+v", task)
	}
	for _, m := range task.Members {
		id := admin.ID()
		if m.ID == b.ID().String() {
			id = b.ID()
		}
		want := api.TaskMember{ID: id.String(), Name: records[id].Name, State: "pending"}
		if st, ok := records[id].Tasks["t/e"]; ok {
			want.State, want.Runs, want.Failures, want.LastRun, want.LastMS, want.Error = st.State, st.Runs, st.Failures, st.LastRun, st.LastMS, st.Error
		}
		if !reflect.DeepEqual(m, want) {
			t.Errorf("member %s: %+v, want %+v", m.Name, m, want)
		}
	}
}
