package plugins

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func loadBuiltin(t *testing.T, env Env, name string, cfg map[string]string) *Instance {
	t.Helper()
	in, err := Builtins(env).Load(name, "t", cfg)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func code(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func TestLoadRefusesBadConfig(t *testing.T) {
	reg := Builtins(Env{FileDir: t.TempDir(), Facts: func(context.Context) (map[string]any, error) { return nil, nil }})
	for _, c := range []struct {
		name string
		cfg  map[string]string
		want string
	}{
		{"nope", nil, "unknown plugin"},
		{"echo", map[string]string{"color": "red"}, `unknown config key "color"`},
		{"exec", map[string]string{"timeout": "soon"}, `timeout="soon"`},
		{"exec", map[string]string{"max_output": "-1"}, `max_output="-1"`},
		{"file", map[string]string{"path": "../../etc/passwd"}, "relative path inside"},
		{"file", map[string]string{"path": "/etc/passwd"}, "relative path inside"},
		{"file", map[string]string{"max_bytes": "0"}, `max_bytes="0"`},
		{"file", map[string]string{"max_bytes": "lots"}, `max_bytes="lots"`},
		{"sys", map[string]string{"paths": "relative"}, "absolute paths"},
		{"echo", map[string]string{"concurrency": "0"}, "concurrency"},
		{"echo", map[string]string{"queue": "many"}, "queue"},
	} {
		_, err := reg.Load(c.name, "t", c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("load %s %v: err %v, want it to mention %q", c.name, c.cfg, err, c.want)
		}
	}
}

func execEnv() Env {
	return Env{Exec: ExecConfig{Commands: map[string]Command{
		"hello":  {Argv: []string{"echo", "hello"}},
		"fail":   {Argv: []string{"sh", "-c", "echo oops >&2; exit 3"}},
		"flood":  {Argv: []string{"sh", "-c", "yes | head -c 100000"}, MaxOutput: 1000},
		"linger": {Argv: []string{"sh", "-c", "sleep 30 & sleep 30"}, Timeout: 200 * time.Millisecond},
	}}}
}

func runExec(t *testing.T, in *Instance, args string) (ExecResult, error) {
	t.Helper()
	b, err := in.Invoke(context.Background(), "run", json.RawMessage(args))
	var res ExecResult
	if b != nil {
		if jerr := json.Unmarshal(b, &res); jerr != nil {
			t.Fatal(jerr)
		}
	}
	return res, err
}

func TestExecRunsOnlyDefinedCommands(t *testing.T) {
	in := loadBuiltin(t, execEnv(), "exec", nil)
	res, err := runExec(t, in, `{"command":"hello"}`)
	if err != nil || res.Stdout != "hello\n" || res.ExitCode != 0 {
		t.Fatalf("hello: %+v %v", res, err)
	}
	if _, err := runExec(t, in, `{"command":"rm-everything"}`); code(err) != CodeBadRequest {
		t.Fatalf("undefined command: %v", err)
	}
	if _, err := runExec(t, in, `{"argv":["id"]}`); code(err) != CodeUnauthorized {
		t.Fatalf("argv without allow_any: %v", err)
	}
	if _, err := runExec(t, in, `{"command":"hello","extra":1}`); code(err) != CodeBadRequest {
		t.Fatalf("unknown argument: %v", err)
	}
	// Arguments of the wrong type are refused in plain words, not Go's.
	if _, err := runExec(t, in, `{"command":["hello"]}`); code(err) != CodeBadRequest || err.Error() != `arguments: field "command": want text, got a list` {
		t.Fatalf("command as a list: %v", err)
	}
	env := execEnv()
	env.Exec.AllowAny = true
	res, err = runExec(t, loadBuiltin(t, env, "exec", nil), `{"argv":["echo","any"]}`)
	if err != nil || res.Stdout != "any\n" {
		t.Fatalf("argv with allow_any: %+v %v", res, err)
	}
}

func TestExecReportsFailureWithOutput(t *testing.T) {
	in := loadBuiltin(t, execEnv(), "exec", nil)
	res, err := runExec(t, in, `{"command":"fail"}`)
	if code(err) != CodeFailed || res.ExitCode != 3 || res.Stderr != "oops\n" {
		t.Fatalf("got %+v %v; want exit 3 with stderr and a failed error", res, err)
	}
	res, err = runExec(t, in, `{"command":"flood"}`)
	if err != nil || len(res.Stdout) != 1000 || !res.Truncated {
		t.Fatalf("flood: %d bytes, truncated %v, err %v; want 1000 and truncated", len(res.Stdout), res.Truncated, err)
	}
	// The tribe's config lowers the host's cap.
	res, _ = runExec(t, loadBuiltin(t, execEnv(), "exec", map[string]string{"max_output": "10"}), `{"command":"flood"}`)
	if len(res.Stdout) != 10 {
		t.Fatalf("tribe cap: %d bytes, want 10", len(res.Stdout))
	}
}

func TestExecTimeoutKillsTheProcessGroup(t *testing.T) {
	in := loadBuiltin(t, execEnv(), "exec", nil)
	start := time.Now()
	_, err := runExec(t, in, `{"command":"linger"}`)
	if code(err) != CodeTimeout {
		t.Fatalf("got %v, want timeout", err)
	}
	// The background sleep holds stdout open; killing only the shell would
	// leave Run waiting for it until WaitDelay and beyond.
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %v: the command's children outlived the timeout", d)
	}
}

// TestExecEndsWhatTheCommandLeft: a command that ends leaves nothing of
// its process group running, or each call of it would leave a process
// that no timeout and no concurrency limit bounds.
func TestExecEndsWhatTheCommandLeft(t *testing.T) {
	in := loadBuiltin(t, Env{Exec: ExecConfig{Commands: map[string]Command{
		"detach": {Argv: []string{"sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"}},
	}}}, "exec", nil)
	res, err := runExec(t, in, `{"command":"detach"}`)
	if err != nil {
		t.Fatalf("detach: %+v %v", res, err)
	}
	pid := strings.TrimSpace(res.Stdout)
	// Killed, it is gone or a zombie until whoever inherited it reaps it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		stat, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			return
		}
		if _, after, ok := strings.Cut(string(stat), ") "); ok && strings.HasPrefix(after, "Z") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the background sleep (pid %s) still runs after the command ended: %s", pid, stat)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A child left in the background holding the command's output open is
// killed as the command ends, before its output is waited for: the
// command succeeds (waited for, its pipes open, it failed after the
// second Go's WaitDelay allows).
func TestExecEndsWhatHoldsItsOutput(t *testing.T) {
	in := loadBuiltin(t, Env{Exec: ExecConfig{Commands: map[string]Command{
		"hold": {Argv: []string{"sh", "-c", "sleep 30 & echo started"}},
	}}}, "exec", nil)
	res, err := runExec(t, in, `{"command":"hold"}`)
	if err != nil || strings.TrimSpace(res.Stdout) != "started" {
		t.Fatalf("hold: %+v %v", res, err)
	}
}

func TestExecList(t *testing.T) {
	in := loadBuiltin(t, execEnv(), "exec", map[string]string{"timeout": "90s"})
	b, err := in.Invoke(context.Background(), "list", nil)
	if err != nil || !strings.Contains(string(b), `{"name":"hello","argv":["echo","hello"],"timeout":"30s","timeout_ms":30000,"max_output":65536}`) {
		t.Fatalf("list: %s %v", b, err)
	}
	// Durations as text and milliseconds, never nanoseconds; a tribe's cap
	// lowers what a command runs with.
	in = loadBuiltin(t, Env{Exec: ExecConfig{Commands: map[string]Command{"slow": {Argv: []string{"sleep", "600"}, Timeout: 5 * time.Minute}}}}, "exec", map[string]string{"timeout": "90s"})
	if b, _ := in.Invoke(context.Background(), "list", nil); !strings.Contains(string(b), `"timeout":"1m30s","timeout_ms":90000`) {
		t.Errorf("list with a tribe cap: %s", b)
	}
	// No commands: an empty list, not null.
	in = loadBuiltin(t, Env{}, "exec", nil)
	if b, err := in.Invoke(context.Background(), "list", nil); err != nil || string(b) != "[]" {
		t.Errorf("list with no commands: %s %v", b, err)
	}
}

func TestFilePublishAppendsLines(t *testing.T) {
	dir := t.TempDir()
	in := loadBuiltin(t, Env{FileDir: dir}, "file", map[string]string{"path": "sub/out.jsonl"})
	for _, d := range []string{`{"a":1}`, `[2]`} {
		if _, err := in.Invoke(context.Background(), "publish", json.RawMessage(d)); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(filepath.Join(dir, "sub/out.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var line struct {
			Time time.Time       `json:"time"`
			Data json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil || line.Time.IsZero() {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		got = append(got, string(line.Data))
	}
	if strings.Join(got, " ") != `{"a":1} [2]` {
		t.Fatalf("lines: %v", got)
	}
	if _, err := in.Invoke(context.Background(), "publish", nil); code(err) != CodeBadRequest {
		t.Fatalf("publish nothing: %v", err)
	}
}

func TestFileCapOnlyLowersTheHosts(t *testing.T) {
	for _, c := range []struct {
		host int64
		cfg  string // the tribe's max_bytes, "" for none
		want int64
	}{
		{0, "", DefaultFileMaxBytes},
		{0, "1000", 1000},
		{0, "999999999999", DefaultFileMaxBytes},
		{500, "", 500},
		{500, "100", 100},
		{500, "1000", 500},
	} {
		cfg := map[string]string{}
		if c.cfg != "" {
			cfg["max_bytes"] = c.cfg
		}
		in := loadBuiltin(t, Env{FileDir: t.TempDir(), FileMaxBytes: c.host}, "file", cfg)
		if got := in.Plugin.(*file).maxBytes; got != c.want {
			t.Errorf("host %d, tribe %q: cap %d, want %d", c.host, c.cfg, got, c.want)
		}
	}
}

func TestFilePublishStopsAtTheCap(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "out.jsonl")
	in := loadBuiltin(t, Env{FileDir: dir, FileMaxBytes: 10 << 10}, "file", map[string]string{"path": "out.jsonl", "max_bytes": "1000"})
	data := json.RawMessage(`"` + strings.Repeat("x", 100) + `"`)
	var lines int
	var err error
	for lines = 0; lines < 100; lines++ {
		if _, err = in.Invoke(context.Background(), "publish", data); err != nil {
			break
		}
	}
	if code(err) != CodeTooLarge || !strings.Contains(err.Error(), "max_bytes") || !strings.Contains(err.Error(), "full") {
		t.Fatalf("after %d lines: %v; want a too_large error naming max_bytes", lines, err)
	}
	fi, serr := os.Stat(path)
	if serr != nil {
		t.Fatal(serr)
	}
	// Whole lines of about 150 bytes, up to the cap and no further.
	if lines == 0 || fi.Size() > 1000 || fi.Size() < 1000-200 {
		t.Fatalf("%d lines, %d bytes: want lines up to the 1000-byte cap and no more", lines, fi.Size())
	}
	raw, _ := os.ReadFile(path)
	for l := range strings.Lines(string(raw)) {
		if !json.Valid([]byte(l)) || !strings.HasSuffix(l, "\n") {
			t.Fatalf("not a whole JSON line: %q", l)
		}
	}
	// Refused again, and the file is not touched.
	if _, err := in.Invoke(context.Background(), "publish", data); code(err) != CodeTooLarge {
		t.Fatalf("publish to a full file: %v", err)
	}
	if again, _ := os.Stat(path); again.Size() != fi.Size() {
		t.Fatalf("a refused publish changed the file: %d bytes, was %d", again.Size(), fi.Size())
	}
	// A line bigger than the whole cap is refused before the file is opened.
	big := loadBuiltin(t, Env{FileDir: dir, FileMaxBytes: 50}, "file", map[string]string{"path": "big.jsonl"})
	if _, err := big.Invoke(context.Background(), "publish", data); code(err) != CodeTooLarge {
		t.Fatalf("line over the cap: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "big.jsonl")); !os.IsNotExist(err) {
		t.Fatalf("a refused line created the file: %v", err)
	}
}

// TestFilePublishStaysInTheFileDir: whoever else may write the file dir
// (a file_dir its group can write) must not make publish write elsewhere:
// a symlink for the file or a directory on its path, even one made after
// the plugin loaded, is not followed out of the dir, and a FIFO neither
// holds publish (and the file's lock) for good nor takes the lines.
func TestFilePublishStaysInTheFileDir(t *testing.T) {
	data := json.RawMessage(`"$(id)"`)
	for _, c := range []struct {
		name, path string
		plant      func(t *testing.T, dir, outside string)
	}{
		{"file is a symlink", "out.jsonl", func(t *testing.T, dir, outside string) {
			if err := os.Symlink(filepath.Join(outside, "victim"), filepath.Join(dir, "out.jsonl")); err != nil {
				t.Fatal(err)
			}
		}},
		{"dir is a symlink", "sub/out.jsonl", func(t *testing.T, dir, outside string) {
			if err := os.Rename(filepath.Join(dir, "sub"), filepath.Join(dir, "sub.old")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, filepath.Join(dir, "sub")); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(outside, "out.jsonl"), []byte("victim\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"file is a fifo", "out.jsonl", func(t *testing.T, dir, outside string) {
			if err := syscall.Mkfifo(filepath.Join(dir, "out.jsonl"), 0o666); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, outside := t.TempDir(), t.TempDir()
			victim := filepath.Join(outside, "victim")
			if err := os.WriteFile(victim, []byte("victim\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			in := loadBuiltin(t, Env{FileDir: dir}, "file", map[string]string{"path": c.path})
			c.plant(t, dir, outside)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := in.Plugin.Call(ctx, "publish", data)
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("publish went through")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("publish still blocked after 5 s")
			}
			for _, p := range []string{victim, filepath.Join(outside, "out.jsonl")} {
				if b, err := os.ReadFile(p); err == nil && string(b) != "victim\n" {
					t.Fatalf("%s was written: %q", p, b)
				}
			}
		})
	}
}

func TestSysCollect(t *testing.T) {
	in := loadBuiltin(t, Env{}, "sys", nil)
	b, err := in.Invoke(context.Background(), "collect", json.RawMessage(`{"sample_ms":50}`))
	if err != nil {
		t.Fatal(err)
	}
	var m SysMetrics
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.CPU.Count < 1 || m.Memory.Total == 0 || len(m.Disks) != 1 || m.Disks[0].Total == 0 {
		t.Fatalf("implausible metrics: %s", b)
	}
	if _, err := in.Invoke(context.Background(), "collect", json.RawMessage(`{"sample_ms":999999}`)); code(err) != CodeBadRequest {
		t.Fatalf("huge sample: %v", err)
	}
}

func TestFactsGet(t *testing.T) {
	env := Env{Facts: func(context.Context) (map[string]any, error) {
		return map[string]any{"os": "linux", "rack": 4}, nil
	}}
	in := loadBuiltin(t, env, "facts", nil)
	b, err := in.Invoke(context.Background(), "get", json.RawMessage(`{"names":["rack"]}`))
	if err != nil || string(b) != `{"rack":4}` {
		t.Fatalf("get rack: %s %v", b, err)
	}
}
