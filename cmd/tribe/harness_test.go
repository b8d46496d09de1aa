package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tribeagent/tribe/internal/syncbuf"
	"github.com/tribeagent/tribe/node/api"
)

// tribeBin is the tribe binary built once by TestMain for end-to-end tests.
var tribeBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tribe-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tribeBin = filepath.Join(dir, "tribe")
	// Built as `make build` does, so memory figures match what users run.
	build := exec.Command("go", "build", "-trimpath", "-tags", "urfave_cli_no_docs", "-ldflags", "-s -w", "-o", tribeBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building tribe:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// agentProc is one `tribe agent` process.
type agentProc struct {
	t     testing.TB
	name  string
	dir   string // data dir
	files string // a web agent's dir for the files its commands write
	args  []string
	cmd   *exec.Cmd
	log   *syncbuf.Buffer // the process's output, read while it runs
	done  chan error
}

// shortTempDir makes a data dir whose socket path fits a Unix socket.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tr-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// freePort returns a TCP port that was free a moment ago on loopback,
// below the ephemeral range (see lowPorts).
func freePort(t testing.TB) int {
	t.Helper()
	for range 1000 {
		port := nextLowPort()
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			l.Close()
			return port
		}
	}
	t.Fatal("no free TCP port on loopback between 20000 and 32000")
	return 0
}

// lowPorts hands out ports below Linux's ephemeral range (32768 and
// up): a port the kernel picked (port 0) and that was free a moment ago
// could be given again to any outgoing connection before the agent (ours
// or serf's) bound it, and 50 agents joining at once open many (seen:
// "address already in use").
var lowPorts = struct {
	sync.Mutex
	next int
}{next: 20000 + rand.IntN(10000)}

func nextLowPort() int {
	lowPorts.Lock()
	defer lowPorts.Unlock()
	p := lowPorts.next
	if lowPorts.next++; lowPorts.next >= 32000 {
		lowPorts.next = 20000
	}
	return p
}

// newAgent prepares an agent on loopback with mDNS off; extra args follow.
func newAgent(t testing.TB, name string, extra ...string) *agentProc {
	a := &agentProc{t: t, name: name, dir: shortTempDir(t)}
	a.args = append([]string{"agent", "--data-dir", a.dir, "--name", name, "--no-mdns",
		"--listen", fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", freePort(t)),
		"--listen", "/ip4/127.0.0.1/udp/0/quic-v1", "--log-level", "debug"}, extra...)
	return a
}

// start runs the agent process and waits until its API answers.
func (a *agentProc) start() {
	a.t.Helper()
	a.startCmd(exec.Command(tribeBin, a.args...))
}

func (a *agentProc) startCmd(cmd *exec.Cmd) {
	a.t.Helper()
	a.launch(cmd)
	waitEvery(a.t, 30*time.Second, 5*time.Millisecond, a.name+" to answer on its socket", func() bool {
		select {
		case err := <-a.done:
			a.t.Fatalf("%s exited during start-up: %v\n%s", a.name, err, a.log)
		default:
		}
		_, err := api.NewClient(filepath.Join(a.dir, api.SocketName)).Status(context.Background())
		return err == nil
	})
}

// launch runs cmd as the agent's process, without waiting for its API.
func (a *agentProc) launch(cmd *exec.Cmd) {
	a.t.Helper()
	a.cmd = cmd
	a.log = new(syncbuf.Buffer)
	a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
	if err := a.cmd.Start(); err != nil {
		a.t.Fatal(err)
	}
	a.done = make(chan error, 1)
	go func() { a.done <- a.cmd.Wait() }()
	a.t.Cleanup(a.kill)
}

// kill ends the process with SIGKILL (no clean shutdown), if it runs.
func (a *agentProc) kill() {
	if a.cmd == nil || a.cmd.ProcessState != nil {
		return
	}
	a.cmd.Process.Kill()
	<-a.done
	a.cmd.ProcessState = &os.ProcessState{} // mark as ended for later calls
}

// exited reports whether the agent's process has ended, and how,
// without waiting for it.
func (a *agentProc) exited() (error, bool) {
	select {
	case err := <-a.done:
		a.done <- err // for kill and stop
		return err, true
	default:
		return nil, false
	}
}

// stop sends SIGTERM and returns the exit error.
func (a *agentProc) stop() error {
	start := time.Now()
	a.cmd.Process.Signal(syscall.SIGTERM)
	defer func() { a.t.Logf("%s stopped in %v", a.name, time.Since(start).Round(time.Millisecond)) }()
	select {
	case err := <-a.done:
		a.cmd.ProcessState = &os.ProcessState{}
		return err
	case <-time.After(30 * time.Second):
		a.t.Fatalf("%s did not stop on SIGTERM\n%s", a.name, a.log)
		return nil
	}
}

// run runs a tribe command against the agent and fails the test unless it
// exits with want; it returns what the command printed, stdout then stderr.
func (a *agentProc) run(want int, args ...string) string {
	a.t.Helper()
	out, stderr, code := tribe(append(args, "--data-dir", a.dir)...)
	if code != want {
		a.t.Fatalf("tribe %s: exit %d, want %d: %s%s", strings.Join(args, " "), code, want, out, stderr)
	}
	return out + stderr
}

// status runs `tribe status --json` against the agent.
func (a *agentProc) status() api.Status {
	a.t.Helper()
	var s api.Status
	a.cliJSON(&s, "status")
	return s
}

// peers runs `tribe peers --json` against the agent.
func (a *agentProc) peers() []api.Peer {
	a.t.Helper()
	var p []api.Peer
	a.cliJSON(&p, "peers")
	return p
}

func (a *agentProc) cliJSON(out any, args ...string) {
	a.t.Helper()
	stdout, stderr, code := tribe(append(args, "--data-dir", a.dir, "--json")...)
	if code != 0 {
		a.t.Fatalf("tribe %v: exit %d: %s", args, code, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), out); err != nil {
		a.t.Fatalf("tribe %v: %v\n%s", args, err, stdout)
	}
}

// tcpJoin is the agent's TCP address, for --join.
func (a *agentProc) tcpJoin() string {
	a.t.Helper()
	for _, s := range a.status().Addrs {
		if strings.Contains(s, "/tcp/") {
			return s
		}
	}
	a.t.Fatalf("%s has no TCP address", a.name)
	return ""
}

// tribe runs the tribe binary and returns stdout, stderr and the exit code.
func tribe(args ...string) (string, string, int) {
	cmd := exec.Command(tribeBin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		code = -1
	}
	return stdout.String(), stderr.String(), code
}

// waitUntil polls cond every 100ms until it holds or timeout passes.
func waitUntil(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	waitEvery(t, timeout, 100*time.Millisecond, what, cond)
}

func waitEvery(t testing.TB, timeout, every time.Duration, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(every)
	}
	// A benchmark keeps only its first lines of log: there, only a long
	// wait is worth one.
	if _, bench := t.(*testing.B); !bench || time.Since(start) > 10*time.Second {
		t.Logf("waited %v for %s", time.Since(start).Round(time.Millisecond), what)
	}
}

// seesAll reports whether a's peers are exactly the others, by ID and name.
func seesAll(a *agentProc, others ...*agentProc) bool {
	got := map[string]string{}
	for _, p := range a.peers() {
		got[p.ID] = p.Name
	}
	if len(got) != len(others) {
		return false
	}
	for _, o := range others {
		if got[o.status().ID] != o.name {
			return false
		}
	}
	return true
}
