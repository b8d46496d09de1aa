package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/node/api/events"
)

// watcher is a running `tribe watch --json` whose events are read as they
// come.
type watcher struct {
	t      *testing.T
	cmd    *exec.Cmd
	events chan events.Event
	bad    chan string
	done   chan error
}

func startWatch(t *testing.T, a *agentProc, args ...string) *watcher {
	t.Helper()
	cmd := exec.Command(tribeBin, append([]string{"watch", "--json", "--data-dir", a.dir}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &watcher{t: t, cmd: cmd, events: make(chan events.Event, 1024), bad: make(chan string, 1), done: make(chan error, 1)}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		var all []string
		for sc.Scan() {
			all = append(all, sc.Text())
			if strings.Contains(sc.Text(), "watching events") {
				ready <- ""
			}
		}
		ready <- strings.Join(all, "\n") // ended without being ready, or after
	}()
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var e events.Event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				w.bad <- sc.Text()
				return
			}
			w.events <- e
		}
		w.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	})
	select {
	case out := <-ready:
		if out != "" {
			t.Fatalf("tribe watch ended before watching: %s", out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("tribe watch did not start watching within 30s")
	}
	return w
}

// expect reads events until one matches, skipping (and logging) others.
func (w *watcher) expect(what string, match func(events.Event) bool) events.Event {
	w.t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case e := <-w.events:
			if match(e) {
				w.t.Logf("got %s: %+v", what, e)
				return e
			}
			w.t.Logf("skipped %+v", e)
		case line := <-w.bad:
			w.t.Fatalf("tribe watch printed a line that is not an event: %q", line)
		case err := <-w.done:
			w.t.Fatalf("tribe watch ended while waiting for %s: %v", what, err)
		case <-deadline:
			w.t.Fatalf("no %s within 60s", what)
		}
	}
}

// `tribe watch --json` on one agent prints, in order, a tribe created, a
// node joining it, that node, killed, turning suspect then dead, and
// another node, stopped cleanly, left (never suspect); Ctrl-C ends it with
// status 0.
func TestWatchStreamsFleetEvents(t *testing.T) {
	// Presence every second: a killed node is suspect after 3 s and dead
	// after 6 s.
	a := newAgent(t, "n1", "--probe-interval", "200ms")
	a.start()
	b := newAgent(t, "n2", "--probe-interval", "200ms", "--join", a.tcpJoin())
	// TCP only: a killed peer's QUIC connection would linger for its idle
	// timeout, keeping it alive past its suspect phase.
	if i := slices.Index(b.args, "/ip4/127.0.0.1/udp/0/quic-v1"); i > 0 {
		b.args = slices.Delete(b.args, i-1, i+1)
	}
	b.start()
	c := newAgent(t, "n3", "--probe-interval", "200ms", "--join", a.tcpJoin())
	c.start()
	n2, n3 := b.status().ID, c.status().ID
	waitUntil(t, 30*time.Second, "n1 to see n2 and n3 alive", func() bool {
		var nodes []api.Node
		a.cliJSON(&nodes, "nodes")
		return slices.ContainsFunc(nodes, func(n api.Node) bool { return n.ID == n2 && n.Name == "n2" && n.Liveness == "alive" }) &&
			slices.ContainsFunc(nodes, func(n api.Node) bool { return n.ID == n3 && n.Name == "n3" && n.Liveness == "alive" })
	})

	w := startWatch(t, a)
	if out, stderr, code := tribe("create", "core", "--data-dir", a.dir); code != 0 {
		t.Fatalf("create: exit %d: %s%s", code, out, stderr)
	}
	w.expect("tribe-created core", func(e events.Event) bool {
		return e.Type == events.TribeCreated && e.Tribe == "core" && e.Key == "tribes/core" && !e.Time.IsZero()
	})
	if out, stderr, code := tribe("join", "core", "n2", "--data-dir", a.dir); code != 0 {
		t.Fatalf("join: exit %d: %s%s", code, out, stderr)
	}
	w.expect("member-added n2 to core", func(e events.Event) bool {
		return e.Type == events.MemberAdded && e.Tribe == "core" && e.Node == n2 && e.Name == "n2" && slices.Equal(e.Via, []string{"manual"})
	})
	b.kill()
	w.expect("n2 suspect", func(e events.Event) bool {
		return e.Type == "node-suspect" && e.Node == n2 && e.Name == "n2" && e.State == "suspect" && e.From == "alive"
	})
	w.expect("n2 dead", func(e events.Event) bool {
		return e.Type == "node-dead" && e.Node == n2 && e.State == "dead" && e.From == "suspect"
	})
	if err := c.stop(); err != nil {
		t.Fatalf("n3 on SIGTERM: %v", err)
	}
	left := w.expect("n3 left", func(e events.Event) bool {
		if e.Node == n3 && e.Type == "node-suspect" {
			t.Fatalf("n3, stopped cleanly, went suspect: %+v", e)
		}
		return e.Type == "node-left" && e.Node == n3 && e.Name == "n3" && e.State == "left"
	})
	if left.From != "alive" {
		t.Errorf("n3 left from %q, want alive", left.From)
	}

	w.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-w.done:
		if err != nil {
			t.Fatalf("tribe watch on Ctrl-C: %v, want exit status 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("tribe watch did not end on Ctrl-C")
	}
}
