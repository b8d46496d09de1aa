package external

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tribeagent/tribe/internal/syncbuf"
	"github.com/tribeagent/tribe/plugins/external/wire"
	"github.com/tribeagent/tribe/plugins/sdk"
)

// The test binary is its own plugins: started as one (the agent sets
// TRIBE_PLUGIN), it behaves as its file name says; the tests link that
// name to it in a temp dir.
func TestMain(m *testing.M) {
	if name := os.Getenv("TRIBE_PLUGIN"); name != "" {
		fakePlugin(name)
		return
	}
	os.Exit(m.Run())
}

type testMethods struct{}

func (testMethods) Echo(ctx context.Context, args json.RawMessage) (json.RawMessage, error) {
	return args, nil
}

// Sleep waits ms milliseconds or until its call ends.
func (testMethods) Sleep(ctx context.Context, ms int) (string, error) {
	select {
	case <-time.After(time.Duration(ms) * time.Millisecond):
		return "slept", nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Hang ignores its deadline and its cancel.
func (testMethods) Hang(ctx context.Context, _ json.RawMessage) (string, error) {
	time.Sleep(time.Hour)
	return "", nil
}

func (testMethods) Crash(ctx context.Context, _ json.RawMessage) (string, error) {
	os.Exit(3)
	return "", nil
}

func (testMethods) Huge(ctx context.Context, _ json.RawMessage) (string, error) {
	return strings.Repeat("x", 5<<20), nil
}

func (testMethods) Complain(ctx context.Context, s string) (string, error) {
	fmt.Fprintln(os.Stderr, s)
	return "said", nil
}

// Flood writes n lines to stderr.
func (testMethods) Flood(ctx context.Context, n int) (string, error) {
	for i := range n {
		fmt.Fprintln(os.Stderr, "flood", i)
	}
	return "flooded", nil
}

// Garble writes n lines that are not the protocol's to stdout.
func (testMethods) Garble(ctx context.Context, n int) (string, error) {
	for range n {
		os.Stdout.WriteString("not json\n")
	}
	return "garbled", nil
}

// Env is the plugin's environment.
func (testMethods) Env(ctx context.Context, _ json.RawMessage) ([]string, error) {
	return os.Environ(), nil
}

// Spawn starts `sleep 60` in the background and returns its pid: in the
// plugin's process group, holding none of its pipes, or (how "setsid")
// in a session of its own, holding its stderr.
func (testMethods) Spawn(ctx context.Context, how string) (int, error) {
	return spawnSleeper(how == "setsid")
}

func spawnSleeper(setsid bool) (int, error) {
	cmd := exec.Command("sleep", "60")
	if setsid {
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	return cmd.Process.Pid, nil
}

func (testMethods) Fail(ctx context.Context, _ json.RawMessage) (string, error) {
	return "partial output", errors.New("it went wrong")
}

func fakePlugin(name string) {
	switch name {
	case "garbage":
		fmt.Println("hello, I am not a tribe plugin")
		time.Sleep(time.Hour)
	case "silent":
		time.Sleep(time.Hour)
	case "escaper": // leaves a child that holds its stderr, then says nothing
		if pid, err := spawnSleeper(true); err == nil {
			os.WriteFile(os.Getenv("TMPDIR")+"/escaper.pid", []byte(strconv.Itoa(pid)), 0o644)
		}
		time.Sleep(time.Hour)
	case "wrongname":
		sdk.Main(sdk.Info{Name: "other", Version: "1", Kind: "processor"}, testMethods{})
	case "answerexit", "closeout", "chatty", "deaf", "serial":
		rawPlugin(name)
	case "hangsagain": // crashes after its first handshake; then hangs at start, saying its pid
		started := os.Getenv("TMPDIR") + "/hangsagain.started"
		if _, err := os.Stat(started); err == nil {
			os.WriteFile(os.Getenv("TMPDIR")+"/hangsagain.pid", []byte(strconv.Itoa(os.Getpid())), 0o644)
			time.Sleep(time.Hour)
		}
		os.WriteFile(started, nil, 0o644)
		go func() { time.Sleep(20 * time.Millisecond); os.Exit(4) }()
		sdk.Main(sdk.Info{Name: name, Version: "1", Kind: "processor"}, testMethods{})
	case "crashy": // crashes at start after its handshake, always
		go func() { time.Sleep(20 * time.Millisecond); os.Exit(4) }()
		sdk.Main(sdk.Info{Name: name, Version: "1", Kind: "processor"}, testMethods{})
	default:
		sdk.Main(sdk.Info{Name: name, Version: "1.2.3", Kind: "processor"}, testMethods{})
	}
}

// rawPlugin speaks the protocol by hand: it answers the handshake, then
// the first call without a newline and exits at once (answerexit), or
// closes its stdout at the first call and lives on (closeout), or writes
// 160 KB of lines that are not the protocol's and answers a shutdown
// (chatty), or reads its first call and then nothing more, answering
// nothing (deaf: one that handles a call at a time, busy or hung), or
// answers each call half a second after it read it, reading nothing
// meanwhile (serial: one at a time, and healthy).
func rawPlugin(name string) {
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 64<<10), 2<<20)
	for sc.Scan() {
		var req struct {
			ID     int64  `json:"id"`
			Method string `json:"method"`
		}
		json.Unmarshal(sc.Bytes(), &req)
		switch {
		case req.Method == wire.MethodHandshake:
			fmt.Printf(`{"jsonrpc":"2.0","id":%d,"result":{"protocol":1,"name":%q,"version":"1","kind":"processor","methods":["echo"]}}`+"\n", req.ID, name)
			if name == "chatty" { // more than a pipe holds, with no call waiting
				os.Stdout.WriteString(strings.Repeat(strings.Repeat("c", 999)+"\n", 160))
			}
		case name == "chatty" && req.Method == wire.MethodShutdown:
			fmt.Printf(`{"jsonrpc":"2.0","id":%d,"result":null}`+"\n", req.ID)
			os.Exit(0)
		case name == "deaf":
			fmt.Fprintln(os.Stderr, "took a call")
			time.Sleep(time.Hour)
		case name == "serial":
			fmt.Fprintln(os.Stderr, "took a call")
			time.Sleep(500 * time.Millisecond)
			fmt.Printf(`{"jsonrpc":"2.0","id":%d,"result":"done"}`+"\n", req.ID)
		case name == "closeout":
			os.Stdout.Close()
			time.Sleep(time.Hour)
		default:
			fmt.Printf(`{"jsonrpc":"2.0","id":%d,"result":"last words"}`, req.ID) // no newline: the last line
			os.Exit(0)
		}
	}
}

// plugin links name to the test binary in a temp dir and returns its path.
func pluginPath(t *testing.T, name string) string { return pluginPathB(t, name) }

func pluginPathB(t testing.TB, name string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.Symlink(self, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func testConfig(log *syncbuf.Buffer) Config {
	return Config{Log: slog.New(slog.NewTextHandler(log, nil)), HandshakeTimeout: 2 * time.Second,
		KillGrace: 200 * time.Millisecond, StopGrace: time.Second, BackoffMin: 10 * time.Millisecond,
		BackoffMax: 50 * time.Millisecond, CrashLimit: 3, CrashWindow: time.Minute}
}

func start(t *testing.T, name string, log *syncbuf.Buffer) *Plugin {
	t.Helper()
	p, err := Start(pluginPath(t, name), testConfig(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func call(p *Plugin, timeout time.Duration, method, args string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := p.Call(ctx, method, json.RawMessage(args))
	return string(out), err
}

// restarted reports whether p runs a process other than first.
func restarted(p *Plugin, first *process) bool {
	cur := p.current()
	return cur != nil && cur != first && p.Health() == nil
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestHandshakeAndCall(t *testing.T) {
	p := start(t, "good", &syncbuf.Buffer{})
	if p.Name() != "good" || p.Version() != "1.2.3" || p.Kind() != "processor" {
		t.Fatalf("handshake: %s %s %s", p.Name(), p.Version(), p.Kind())
	}
	if want := []string{"complain", "crash", "echo", "env", "fail", "flood", "garble", "hang", "huge", "sleep", "spawn"}; !equal(p.Methods(), want) {
		t.Fatalf("methods %v, want %v", p.Methods(), want)
	}
	if out, err := call(p, time.Second, "echo", `{"a":[1,2]}`); err != nil || out != `{"a":[1,2]}` {
		t.Fatalf("echo: %s %v", out, err)
	}
	// A failed method's output comes with its error, as a command's does.
	if out, err := call(p, time.Second, "fail", `null`); err == nil || err.Error() != "it went wrong" || out != `"partial output"` {
		t.Fatalf("fail: %s %v", out, err)
	}
}

func equal(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }

// A call past its deadline, or cancelled, returns at once; a plugin that
// honours the cancel keeps running.
func TestDeadlineAndCancel(t *testing.T) {
	p := start(t, "good", &syncbuf.Buffer{})
	begin := time.Now()
	if _, err := call(p, 100*time.Millisecond, "sleep", `5000`); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("sleep past its deadline: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, err := p.Call(ctx, "sleep", json.RawMessage(`5000`)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled sleep: %v", err)
	}
	if took := time.Since(begin); took > 3*time.Second {
		t.Fatalf("the two calls took %v", took)
	}
	time.Sleep(300 * time.Millisecond) // past KillGrace: not killed
	if err := p.Health(); err != nil {
		t.Fatalf("after honoured cancels: %v", err)
	}
	if out, err := call(p, time.Second, "sleep", `1`); err != nil || out != `"slept"` {
		t.Fatalf("after: %s %v", out, err)
	}
}

// Calls in flight at once each get their own answer, whichever of them
// reads the plugin's stdout, also while some of them end at their
// deadline in the middle of reading.
func TestConcurrentCallsGetTheirOwnAnswers(t *testing.T) {
	p := start(t, "good", &syncbuf.Buffer{})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			for j := range 20 {
				switch (i + j) % 4 {
				case 0: // gives up while others read
					if _, err := call(p, time.Millisecond, "sleep", `50`); !errors.Is(err, context.DeadlineExceeded) {
						errs <- fmt.Errorf("sleep past its deadline: %v", err)
					}
				case 1:
					if out, err := call(p, 5*time.Second, "sleep", fmt.Sprint(j%3)); err != nil || out != `"slept"` {
						errs <- fmt.Errorf("sleep: %s %v", out, err)
					}
				default:
					want := fmt.Sprintf(`"%d-%d"`, i, j)
					if out, err := call(p, 5*time.Second, "echo", want); err != nil || out != want {
						errs <- fmt.Errorf("echo %s: %s %v", want, out, err)
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := p.Health(); err != nil {
		t.Fatalf("after: %v", err)
	}
}

// An answer a plugin writes just before it exits reaches its call, read
// by the call or, when no call is reading then, by the process's end.
func TestAnswerBeforeExitIsKept(t *testing.T) {
	p := start(t, "answerexit", &syncbuf.Buffer{})
	first := p.current()
	if out, err := call(p, 5*time.Second, "echo", `1`); err != nil || out != `"last words"` {
		t.Fatalf("a call answered as the plugin exits: %s %v", out, err)
	}
	waitFor(t, "the plugin to be started again", func() bool { return restarted(p, first) })
	proc := p.current()
	_, ch, err := proc.send(context.Background(), wire.MethodCall, wire.CallParams{Method: "echo", TimeoutMS: 1000}, true)
	if err != nil {
		t.Fatal(err)
	}
	<-proc.done // nobody read stdout while it ran
	if r, ok := <-ch; !ok || string(r.Result) != `"last words"` {
		t.Fatalf("the answer left in the pipe: %+v %v", r, ok)
	}
}

// A plugin blocked writing lines nobody read (no call was waiting) still
// stops by itself when asked: the shutdown's wait reads them.
func TestCloseReadsWhatAnIdlePluginWrote(t *testing.T) {
	log := &syncbuf.Buffer{}
	cfg := testConfig(log)
	cfg.StopGrace = 10 * time.Second // the race detector holds an exit for 1 s
	p, err := Start(pluginPath(t, "chatty"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	proc := p.current()
	p.Close()
	if strings.Contains(log.String(), "did not stop by itself") || !strings.Contains(proc.exitErr().Error(), "status 0") {
		t.Fatalf("a chatty idle plugin did not stop cleanly: %v\n%s", proc.exitErr(), log)
	}
}

// A plugin that closes its stdout can answer nothing more: a call
// waiting on it fails at once instead of at its deadline, and the plugin
// is killed and started again.
func TestClosedStdoutIsKilled(t *testing.T) {
	p := start(t, "closeout", &syncbuf.Buffer{})
	first := p.current()
	// Without the rule the call would end at its deadline instead.
	if _, err := call(p, time.Minute, "echo", `1`); err == nil || !strings.Contains(err.Error(), "ended mid-call") || !strings.Contains(err.Error(), "closed its stdout") {
		t.Fatalf("a call to a plugin that closed its stdout: %v", err)
	}
	waitFor(t, "a new process", func() bool { cur := p.current(); return cur != nil && cur != first })
}

// A plugin that crashes mid-call fails that call, saying so, and is
// started again.
func TestCrashMidCallRestarts(t *testing.T) {
	log := &syncbuf.Buffer{}
	p := start(t, "good", log)
	first := p.current()
	_, err := call(p, time.Second, "crash", `null`)
	if err == nil || !strings.Contains(err.Error(), "ended mid-call") || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("crash: %v", err)
	}
	waitFor(t, "the restart", func() bool { return restarted(p, first) })
	if out, err := call(p, time.Second, "echo", `1`); err != nil || out != "1" {
		t.Fatalf("after the restart: %s %v", out, err)
	}
	if !strings.Contains(log.String(), "restarting it") {
		t.Errorf("the restart is not in the log:\n%s", log)
	}
}

// A plugin that ignores its deadline is killed KillGrace later and
// restarted; meanwhile another plugin answers as usual.
func TestHungPluginIsKilled(t *testing.T) {
	log := &syncbuf.Buffer{}
	hung, other := start(t, "good", log), start(t, "other", log)
	first := hung.current()
	if _, err := call(hung, 50*time.Millisecond, "hang", `null`); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hang: %v", err)
	}
	if out, err := call(other, time.Second, "echo", `2`); err != nil || out != "2" {
		t.Fatalf("the other plugin while one hangs: %s %v", out, err)
	}
	waitFor(t, "the hung plugin killed", func() bool { return strings.Contains(log.String(), "killed") })
	waitFor(t, "the hung plugin back", func() bool { return restarted(hung, first) })
	if out, err := call(hung, time.Second, "echo", `3`); err != nil || out != "3" {
		t.Fatalf("after the kill: %s %v", out, err)
	}
}

// What is not a plugin of this protocol is a clear load error.
func TestLoadErrors(t *testing.T) {
	for name, want := range map[string]string{
		"garbage":   "not a JSON-RPC response",
		"silent":    "no handshake answer within",
		"wrongname": "a plugin is named after its file",
	} {
		cfg := testConfig(&syncbuf.Buffer{})
		cfg.HandshakeTimeout = 300 * time.Millisecond
		_, err := Start(pluginPath(t, name), cfg)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "plugin "+name) {
			t.Errorf("%s: %v, want it to say %q", name, err, want)
		}
	}
	if _, err := Start(filepath.Join(t.TempDir(), "missing"), testConfig(&syncbuf.Buffer{})); err == nil {
		t.Error("a missing file started")
	}
}

// An answer over the cap fails its call and restarts the plugin.
func TestHugeAnswerIsCapped(t *testing.T) {
	p := start(t, "good", &syncbuf.Buffer{})
	first := p.current()
	if _, err := call(p, 5*time.Second, "huge", `null`); err == nil || !strings.Contains(err.Error(), "an answer over") {
		t.Fatalf("huge: %v", err)
	}
	waitFor(t, "the restart", func() bool { return restarted(p, first) })
	if out, err := call(p, time.Second, "echo", `4`); err != nil || out != "4" {
		t.Fatalf("after: %s %v", out, err)
	}
}

// Repeated crashes are reported, with the last reason.
func TestRepeatedCrashesReported(t *testing.T) {
	p := start(t, "crashy", &syncbuf.Buffer{})
	waitFor(t, "the crash limit", func() bool {
		err := p.Health()
		return err != nil && strings.Contains(err.Error(), "crashed 3 times")
	})
	if err := p.Health(); !strings.Contains(err.Error(), "exit status 4") {
		t.Errorf("health %v: want the last exit", err)
	}
}

// stderr lines go to the agent's log with the plugin's name; Close stops
// the process.
func TestStderrAndClose(t *testing.T) {
	log := &syncbuf.Buffer{}
	p := start(t, "good", log)
	if _, err := call(p, time.Second, "complain", `"disk nearly full"`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stderr line in the log", func() bool {
		return strings.Contains(log.String(), `plugin=good line="disk nearly full"`)
	})
	proc := p.current()
	p.Close()
	select {
	case <-proc.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the process outlived Close")
	}
	if _, err := call(p, time.Second, "echo", `1`); err == nil {
		t.Fatal("a stopped plugin answered")
	}
}

// alive reports whether process pid runs (a zombie has ended).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, after, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(after, "Z") && !strings.HasPrefix(after, "X")
}

// spawnChild has plugin p start a child (see Spawn), killed when the test
// ends whatever happens, and returns its pid.
func spawnChild(t *testing.T, p *Plugin, how string) int {
	t.Helper()
	out, err := call(p, 5*time.Second, "spawn", `"`+how+`"`)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(out)
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if !alive(pid) {
		t.Fatalf("the child %d did not start", pid)
	}
	return pid
}

// What a plugin leaves running in its process group ends with it, whether
// it is stopped or exits by itself.
func TestChildrenEndWithThePlugin(t *testing.T) {
	for _, stop := range []string{"close", "crash"} {
		t.Run(stop, func(t *testing.T) {
			p := start(t, "good", &syncbuf.Buffer{})
			pid := spawnChild(t, p, "group")
			first := p.current()
			if stop == "close" {
				p.Close()
			} else {
				call(p, time.Second, "crash", `null`)
				waitFor(t, "a restart", func() bool { return restarted(p, first) })
			}
			waitFor(t, "the child's end", func() bool { return !alive(pid) })
		})
	}
}

// A child that left the plugin's process group (setsid) and holds its
// stderr open delays neither Close nor a failed start: the agent reads
// what is left for drainWait, not until that child ends.
func TestAChildOutsideTheGroupHoldsNothingUp(t *testing.T) {
	p := start(t, "good", &syncbuf.Buffer{})
	spawnChild(t, p, "setsid")
	closed := make(chan struct{})
	go func() {
		p.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for a child that left the plugin's group")
	}

	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	cfg := testConfig(&syncbuf.Buffer{})
	cfg.HandshakeTimeout = 300 * time.Millisecond
	started := make(chan error, 1)
	go func() {
		_, err := Start(pluginPath(t, "escaper"), cfg)
		started <- err
	}()
	select {
	case err := <-started:
		if err == nil || !strings.Contains(err.Error(), "no handshake answer within") {
			t.Errorf("start: %v, want no handshake", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a failed start waited for a child that left the plugin's group")
	}
	if b, err := os.ReadFile(filepath.Join(tmp, "escaper.pid")); err == nil {
		pid, _ := strconv.Atoi(string(b))
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

func TestFind(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "good"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "notexec"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, "Bad Name"), []byte("#!/bin/sh\n"), 0o755)
	os.Mkdir(filepath.Join(dir, "adir"), 0o755)
	// Anyone in its group could replace it, and run code as the agent.
	os.WriteFile(filepath.Join(dir, "shared-write"), []byte("#!/bin/sh\n"), 0o755)
	os.Chmod(filepath.Join(dir, "shared-write"), 0o775)
	found, skipped, err := Find(dir)
	if err != nil || len(found) != 1 || found["good"] == "" || len(skipped) != 3 {
		t.Fatalf("found %v, skipped %v, %v", found, skipped, err)
	}
	if !strings.Contains(fmt.Sprint(skipped), "shared-write: writable by group or others") {
		t.Errorf("skipped %v: want the group-writable plugin said so", skipped)
	}
	if found, _, err := Find(filepath.Join(dir, "none")); err != nil || len(found) != 0 {
		t.Fatalf("a missing dir: %v %v", found, err)
	}
	os.Chmod(dir, 0o777)
	if found, _, err := Find(dir); err == nil || !strings.Contains(err.Error(), "writable by group or others") {
		t.Fatalf("a world-writable plugin dir: %v %v", found, err)
	}
}

// A plugin gets little of the agent's environment, and a flood of stderr
// lines reaches the log only so fast.
func TestEnvAndStderrFlood(t *testing.T) {
	t.Setenv("TRIBE_SECRET", "s3cret")
	log := &syncbuf.Buffer{}
	p := start(t, "good", log)
	out, err := call(p, time.Second, "env", `null`)
	if err != nil || strings.Contains(out, "s3cret") || !strings.Contains(out, "TRIBE_PLUGIN=good") {
		t.Fatalf("env: %s %v", out, err)
	}
	begin := time.Now()
	if _, err := call(p, 5*time.Second, "flood", `5000`); err != nil {
		t.Fatal(err)
	}
	p.Close() // the count of dropped lines comes with the next line, or at the end
	waitFor(t, "the dropped lines said", func() bool { return strings.Contains(log.String(), "dropped=") })
	allowed := stderrBurst + int(stderrPerSecond*time.Since(begin).Seconds()) + 1
	if n := strings.Count(log.String(), `msg="plugin stderr"`); n > allowed {
		t.Errorf("%d of 5000 stderr lines logged, at most %d allowed", n, allowed)
	}
}

// Lines that break the protocol after the handshake are ignored, and
// logged at most once a second; the plugin goes on answering.
func TestGarbageAfterTheHandshake(t *testing.T) {
	log := &syncbuf.Buffer{}
	p := start(t, "good", log)
	if out, err := call(p, 5*time.Second, "garble", `500`); err != nil || out != `"garbled"` {
		t.Fatalf("garble: %s %v", out, err)
	}
	if out, err := call(p, time.Second, "echo", `7`); err != nil || out != "7" {
		t.Fatalf("after the garbage: %s %v", out, err)
	}
	if n := strings.Count(log.String(), "not a JSON-RPC answer"); n < 1 || n > 3 {
		t.Errorf("%d warnings for 500 bad lines, want one a second", n)
	}
	if got := p.BadLines(); got != 500 {
		t.Errorf("%d bad lines counted, want 500", got)
	}
}

// A request the plugin does not read (it takes one call at a time and is
// stuck in one; the request is bigger than its pipe holds) gives up at its
// deadline and, still not written whole KillGrace later, gets the plugin
// killed: it used to hold the call, the other call's cancel behind it, and
// the plugin's unload, for good.
func TestStuckWriteEndsAtTheDeadline(t *testing.T) {
	log := &syncbuf.Buffer{}
	cfg := testConfig(log)
	// The stuck write's deadline and grace end (0.6 s) before the first
	// call's (1.3 s): it is the write that gets the plugin killed.
	cfg.KillGrace = 300 * time.Millisecond
	p, err := Start(pluginPath(t, "deaf"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	first := p.current()
	t.Cleanup(func() { first.kill() })
	errs := make(chan error, 2)
	go func() { _, err := call(p, time.Second, "echo", `1`); errs <- err }()
	waitFor(t, "the plugin to take the first call", func() bool { return strings.Contains(log.String(), "took a call") })
	big := `"` + strings.Repeat("x", 256<<10) + `"` // four pipes' worth
	bigErr := make(chan error, 1)
	go func() { _, err := call(p, 300*time.Millisecond, "echo", big); bigErr <- err }()
	var got []error
	waitFor(t, "both calls to return", func() bool {
		select {
		case err := <-errs:
			got = append(got, err)
		case err := <-bigErr:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("the call whose request was not read: %v, want its deadline", err)
			}
			got = append(got, err)
		default:
		}
		return len(got) == 2
	})
	for _, err := range got {
		if err == nil {
			t.Errorf("a call to a plugin that reads nothing more was answered")
		}
	}
	waitFor(t, "the deaf plugin to be killed and started again", func() bool { return restarted(p, first) })
	if !strings.Contains(log.String(), "did not read its stdin") {
		t.Errorf("the log does not say why it was killed:\n%s", log.String())
	}
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	waitFor(t, "the plugin to close", func() bool {
		select {
		case <-closed:
			return true
		default:
			return false
		}
	})
}

// A plugin that takes one call at a time, busy in a healthy one when a
// request bigger than its pipe comes, is not killed when that request's
// deadline cuts the write short: the rest is written once it reads again,
// within KillGrace, and the call it was busy in is answered.
func TestSerialPluginNotKilledForALateRead(t *testing.T) {
	log := &syncbuf.Buffer{}
	cfg := testConfig(log)
	cfg.KillGrace = 2 * time.Second
	p, err := Start(pluginPath(t, "serial"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	first := p.current()
	answer := make(chan error, 1)
	go func() {
		got, err := call(p, 5*time.Second, "echo", `1`)
		if err == nil && string(got) != `"done"` {
			err = fmt.Errorf("answered %s", got)
		}
		answer <- err
	}()
	waitFor(t, "the plugin to take the first call", func() bool { return strings.Contains(log.String(), "took a call") })
	big := `"` + strings.Repeat("x", 256<<10) + `"` // four pipes' worth
	if _, err := call(p, 100*time.Millisecond, "echo", big); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the call whose request waited: %v, want its deadline", err)
	}
	if err := <-answer; err != nil {
		t.Fatalf("the call the plugin was busy in: %v", err)
	}
	if p.current() != first || strings.Contains(log.String(), "did not read its stdin") {
		t.Fatalf("the plugin was killed:\n%s", log.String())
	}
}

// Unloading a plugin stuck on a request it does not read does not wait
// for that request's deadline (a minute here).
func TestCloseDoesNotWaitForAStuckWrite(t *testing.T) {
	log := &syncbuf.Buffer{}
	p, err := Start(pluginPath(t, "deaf"), testConfig(log))
	if err != nil {
		t.Fatal(err)
	}
	first := p.current()
	t.Cleanup(func() { first.kill() })
	go call(p, time.Minute, "echo", `1`)
	waitFor(t, "the plugin to take the first call", func() bool { return strings.Contains(log.String(), "took a call") })
	done := make(chan error, 1)
	go func() { _, err := call(p, time.Minute, "echo", `"`+strings.Repeat("x", 256<<10)+`"`); done <- err }()
	// The plugin reads nothing more: the request holds stdin for good.
	waitFor(t, "the big request to be written", func() bool { return len(first.wmu) == 1 })
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	var callErr error
	ended := false
	waitFor(t, "the plugin to close and the stuck call to end", func() bool {
		select {
		case callErr = <-done:
			ended = true
		default:
		}
		select {
		case <-closed:
			return ended
		default:
			return false
		}
	})
	if callErr == nil {
		t.Errorf("the stuck call was answered")
	}
	if cur := p.current(); cur != first {
		t.Errorf("the plugin was started again after Close")
	}
}

// A plugin whose file is still open for writing somewhere (a child that
// this process forked just as the file was installed holds it until it
// execs) is refused "text file busy" by the kernel for a moment: the start
// is tried again, and the plugin starts once the file is closed.
func TestStartWaitsOutATextFileBusy(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "echo")
	if err := os.WriteFile(path, b, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(path, os.O_WRONLY, 0) // as a forked child holds it
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(30*time.Millisecond, func() { w.Close() })
	log := &syncbuf.Buffer{}
	p, err := Start(path, testConfig(log))
	if err != nil {
		t.Fatalf("start while the file was open for writing a moment: %v", err)
	}
	defer p.Close()
	if got, err := call(p, time.Second, "echo", `"x"`); err != nil || string(got) != `"x"` {
		t.Fatalf("echo: %s %v", got, err)
	}
}

// Close while the plugin is being started again leaves nothing running:
// the start under way (one that hangs in its handshake here) is ended
// and waited for before Close returns. It used to run on for the
// handshake's timeout, or for good if the agent exited meanwhile.
func TestCloseDuringARestartLeavesNoProcess(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	cfg := testConfig(&syncbuf.Buffer{})
	cfg.HandshakeTimeout = 5 * time.Second
	p, err := Start(pluginPath(t, "hangsagain"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	waitFor(t, "the restart to hang in its handshake", func() bool {
		b, err := os.ReadFile(filepath.Join(tmp, "hangsagain.pid"))
		pid, _ = strconv.Atoi(string(b))
		return err == nil && pid > 0
	})
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	begun := time.Now()
	p.Close()
	if alive(pid) {
		t.Fatalf("the plugin's process %d runs on after Close", pid)
	}
	if took := time.Since(begun); took > 2*time.Second {
		t.Errorf("Close took %v: it waited out the handshake's timeout", took)
	}
}
