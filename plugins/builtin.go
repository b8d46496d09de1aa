package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tribeagent/tribe/plugins/jsonerr"
)

// Env is what the built-ins need from the host.
type Env struct {
	// Exec is the host's own command table for the exec plugin.
	Exec ExecConfig
	// ExecTable, if set, is asked for the command table on every call
	// instead of Exec, so the host can change it live (tribe reload).
	ExecTable func() ExecConfig
	// Facts returns the host's current facts (the facts plugin).
	Facts func(context.Context) (map[string]any, error)
	// FileDir is where the file plugin writes; a tribe's config names a
	// file inside it, never a path outside.
	FileDir string
	// FileMaxBytes is the host's ceiling on the size of each file the file
	// plugin writes; zero means DefaultFileMaxBytes. A tribe's max_bytes
	// can only lower it.
	FileMaxBytes int64
	// Version is the built-ins' version: the agent's.
	Version string
}

// Builtins returns a registry of the built-in plugins.
func Builtins(env Env) *Registry {
	r := NewRegistry()
	v := version(env.Version)
	table := env.ExecTable
	if table == nil {
		table = func() ExecConfig { return env.Exec }
	}
	r.Register("exec", func(cfg map[string]string) (Plugin, error) { return newExec(v, table, cfg) })
	r.Register("sys", func(cfg map[string]string) (Plugin, error) { return newSys(v, cfg) })
	r.Register("facts", func(cfg map[string]string) (Plugin, error) {
		if err := noConfig(cfg); err != nil {
			return nil, err
		}
		if env.Facts == nil {
			return nil, fmt.Errorf("this host has no facts source")
		}
		return factsPlugin{v, env.Facts}, nil
	})
	r.Register("echo", func(cfg map[string]string) (Plugin, error) {
		if err := noConfig(cfg); err != nil {
			return nil, err
		}
		return echo{v}, nil
	})
	r.Register("file", func(cfg map[string]string) (Plugin, error) { return newFile(v, env.FileDir, env.FileMaxBytes, cfg) })
	return r
}

// version gives a built-in its Version method: the agent's version.
type version string

func (v version) Version() string { return string(v) }

// configKeys refuses keys other than allowed.
func configKeys(cfg map[string]string, allowed ...string) error {
	for _, k := range slices.Sorted(maps.Keys(cfg)) {
		if !slices.Contains(allowed, k) {
			if len(allowed) == 0 {
				return fmt.Errorf("unknown config key %q: this plugin takes none (besides concurrency and queue)", k)
			}
			return fmt.Errorf("unknown config key %q (known: %s, concurrency, queue)", k, strings.Join(allowed, ", "))
		}
	}
	return nil
}

func noConfig(cfg map[string]string) error { return configKeys(cfg) }

// decodeArgs decodes a call's arguments strictly.
func decodeArgs(args json.RawMessage, v any) error {
	if len(args) == 0 || string(args) == "null" {
		args = []byte("{}")
	}
	dec := json.NewDecoder(strings.NewReader(string(args)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Errorf(CodeBadRequest, "arguments: %v", jsonerr.Plain(err))
	}
	return nil
}

// echo returns its arguments: for tests and benchmarks of the call path.
type echo struct{ version }

func (echo) Name() string      { return "echo" }
func (echo) Kind() Kind        { return Processor }
func (echo) Methods() []string { return []string{"echo"} }
func (echo) Call(_ context.Context, _ string, args json.RawMessage) (json.RawMessage, error) {
	if len(args) == 0 {
		return json.RawMessage("null"), nil
	}
	return args, nil
}

// factsPlugin returns the host's facts.
type factsPlugin struct {
	version
	get func(context.Context) (map[string]any, error)
}

func (factsPlugin) Name() string      { return "facts" }
func (factsPlugin) Kind() Kind        { return Collector }
func (factsPlugin) Methods() []string { return []string{"get"} }
func (f factsPlugin) Call(ctx context.Context, _ string, args json.RawMessage) (json.RawMessage, error) {
	var a struct {
		Names []string `json:"names"` // only these facts; all when empty
	}
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
	}
	facts, err := f.get(ctx)
	if err != nil {
		return nil, err
	}
	if len(a.Names) > 0 {
		only := map[string]any{}
		for _, n := range a.Names {
			if v, ok := facts[n]; ok {
				only[n] = v
			}
		}
		facts = only
	}
	return json.Marshal(facts)
}

// DefaultFileMaxBytes is the file plugin's cap on each file when the host
// sets none.
const DefaultFileMaxBytes = 64 << 20

// file appends what is published to it as JSON lines, up to maxBytes per
// file: beyond it publish is refused, so a caller cannot fill the disk.
type file struct {
	version
	dir, name string // the host's file dir, the file's path inside it
	path      string // dir and name joined, for messages and the lock
	maxBytes  int64
	mu        *sync.Mutex // shared by every instance writing path
}

// fileLocks holds one lock per file path, shared by every instance that
// writes it (two tribes naming one file, or an instance and its reload),
// so the size check and the append are one step.
var fileLocks sync.Map // path -> *sync.Mutex

func newFile(v version, dir string, hostMax int64, cfg map[string]string) (*file, error) {
	if err := configKeys(cfg, "path", "max_bytes"); err != nil {
		return nil, err
	}
	if dir == "" {
		return nil, fmt.Errorf("this host has no directory for published files")
	}
	if hostMax < 0 {
		return nil, fmt.Errorf("this host's file size cap is negative (%d)", hostMax)
	}
	maxBytes := cmp(hostMax, DefaultFileMaxBytes)
	if s, ok := cfg["max_bytes"]; ok {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("max_bytes=%q: want a positive number of bytes", s)
		}
		maxBytes = min(maxBytes, n) // the tribe lowers the host's cap, never raises it
	}
	name := cfg["path"]
	if name == "" {
		name = "published.jsonl"
	}
	if filepath.IsAbs(name) || !filepath.IsLocal(name) {
		return nil, fmt.Errorf("path %q: give a relative path inside the host's file directory (%s)", name, dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	name = filepath.Clean(name)
	if err := root.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, name)
	mu, _ := fileLocks.LoadOrStore(path, new(sync.Mutex))
	return &file{version: v, dir: dir, name: name, path: path, maxBytes: maxBytes, mu: mu.(*sync.Mutex)}, nil
}

func (*file) Name() string      { return "file" }
func (*file) Kind() Kind        { return Publisher }
func (*file) Methods() []string { return []string{"publish"} }

// Call appends {"time", "data"} as one line and answers with where and how
// much it wrote. A line that would take the file past maxBytes is refused
// whole; a failed write (a full disk) is cut back off, so the file never
// ends in half a line.
func (f *file) Call(_ context.Context, _ string, args json.RawMessage) (json.RawMessage, error) {
	if len(args) == 0 {
		return nil, Errorf(CodeBadRequest, "publish: give the data to write as the arguments")
	}
	line, err := json.Marshal(struct {
		Time time.Time       `json:"time"`
		Data json.RawMessage `json:"data"`
	}{time.Now().UTC(), args})
	if err != nil {
		return nil, Errorf(CodeBadRequest, "publish: %v", err)
	}
	line = append(line, '\n')
	if int64(len(line)) > f.maxBytes {
		return nil, Errorf(CodeTooLarge, "publish: a line of %d bytes is over the file's cap of %d bytes (max_bytes)", len(line), f.maxBytes)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// Whoever else may write the file dir (a file_dir its group can write)
	// could swap the file, or a directory on its path, for a symlink at
	// any time: the file is opened through an os.Root, which follows no
	// link out of the dir, and non-blocking, so a FIFO put there is
	// refused below instead of holding publish (and the lock) for good.
	root, err := os.OpenRoot(f.dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	w, err := root.OpenFile(f.name, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NONBLOCK, 0o600)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	fi, err := w.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, Errorf(CodeFailed, "publish: %s is not a regular file (%v)", f.path, fi.Mode().Type())
	}
	size := fi.Size()
	if size+int64(len(line)) > f.maxBytes {
		return nil, Errorf(CodeTooLarge, "publish: %s is full: it holds %d bytes, and this line of %d would take it past its cap of %d bytes (max_bytes); move or empty the file to publish again",
			f.path, size, len(line), f.maxBytes)
	}
	if _, err := w.Write(line); err != nil {
		w.Truncate(size) // best effort: drop what part of the line got in
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"path": f.path, "bytes": len(line)})
}
