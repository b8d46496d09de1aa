package plugins

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/internal/procwait"
)

// Command is one command a host lets the exec plugin run: it is defined
// in the host's own config, so a caller can only ask for it by name.
type Command struct {
	Argv []string `yaml:"argv" json:"argv"`
	// Timeout kills the command (and its process group) when it runs
	// longer; zero means DefaultCommandTimeout.
	Timeout time.Duration `yaml:"timeout" json:"timeout,omitempty"`
	// MaxOutput caps what is kept of stdout and of stderr, each; zero
	// means DefaultMaxOutput.
	MaxOutput int `yaml:"max_output" json:"max_output,omitempty"`
}

// ExecConfig is the host's command table.
type ExecConfig struct {
	Commands map[string]Command
	// AllowAny lets callers run an argv of their choosing ({"argv": [...]}).
	// Off unless the host's operator opts in: it hands every trusted
	// caller and tribe member a shell on this host.
	AllowAny bool
}

// Defaults of the exec plugin.
const (
	DefaultCommandTimeout = 30 * time.Second
	DefaultMaxOutput      = 64 << 10
)

// Check reports what is wrong with the table.
func (c ExecConfig) Check() error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(c.Commands)) {
		cmd := c.Commands[name]
		switch {
		case !names.ValidMethod(name):
			errs = append(errs, fmt.Errorf("exec command name %q: use letters, digits, '.', '_' or '-'", name))
		case len(cmd.Argv) == 0 || cmd.Argv[0] == "":
			errs = append(errs, fmt.Errorf("exec command %q has no argv", name))
		case cmd.Timeout < 0 || cmd.MaxOutput < 0:
			errs = append(errs, fmt.Errorf("exec command %q: negative timeout or output cap", name))
		}
	}
	return errors.Join(errs...)
}

type execPlugin struct {
	version
	table     func() ExecConfig // the host's, read on every call
	timeout   time.Duration     // the tribe's cap on every command, 0 for none
	maxOutput int               // the tribe's cap on output, 0 for none
}

func newExec(v version, table func() ExecConfig, cfg map[string]string) (*execPlugin, error) {
	if err := configKeys(cfg, "timeout", "max_output"); err != nil {
		return nil, err
	}
	if err := table().Check(); err != nil {
		return nil, err
	}
	p := &execPlugin{version: v, table: table}
	if v, ok := cfg["timeout"]; ok {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("timeout=%q: want a positive duration such as 10s", v)
		}
		p.timeout = d
	}
	if v, ok := cfg["max_output"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("max_output=%q: want a positive number of bytes", v)
		}
		p.maxOutput = n
	}
	return p, nil
}

func (*execPlugin) Name() string      { return "exec" }
func (*execPlugin) Kind() Kind        { return Action }
func (*execPlugin) Methods() []string { return []string{"run", "list"} }

// ExecResult is what `exec run` answers.
type ExecResult struct {
	Command   string   `json:"command,omitempty"`
	Argv      []string `json:"argv"`
	ExitCode  int      `json:"exit_code"`
	Stdout    string   `json:"stdout"`
	Stderr    string   `json:"stderr"`
	Truncated bool     `json:"truncated,omitempty"` // output beyond the cap was dropped
	MS        int64    `json:"ms"`
}

func (p *execPlugin) Call(ctx context.Context, method string, args json.RawMessage) (json.RawMessage, error) {
	if method == "list" {
		return json.Marshal(p.list())
	}
	var a struct {
		Command string   `json:"command"`
		Argv    []string `json:"argv"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
	}
	var cmd Command
	table := p.table()
	switch {
	case a.Command != "" && len(a.Argv) > 0:
		return nil, Errorf(CodeBadRequest, "give either command or argv, not both")
	case a.Command != "":
		var ok bool
		if cmd, ok = table.Commands[a.Command]; !ok {
			return nil, Errorf(CodeBadRequest, "no command %q on this host (it has %v)", a.Command, slices.Sorted(maps.Keys(table.Commands)))
		}
	case len(a.Argv) > 0:
		if !table.AllowAny {
			return nil, Errorf(CodeUnauthorized, "this host runs only the commands its config defines (exec: allow_any is off)")
		}
		cmd = Command{Argv: a.Argv}
	default:
		return nil, Errorf(CodeBadRequest, `name a command: {"command": NAME}`)
	}
	timeout, maxOut := p.limits(cmd)
	return run(ctx, a.Command, cmd.Argv, timeout, maxOut)
}

// limits are what a command runs with: its own timeout and output cap or
// the defaults, lowered by the tribe's caps.
func (p *execPlugin) limits(cmd Command) (time.Duration, int) {
	timeout := cmp(cmd.Timeout, DefaultCommandTimeout)
	if p.timeout > 0 {
		timeout = min(timeout, p.timeout)
	}
	maxOut := cmp(cmd.MaxOutput, DefaultMaxOutput)
	if p.maxOutput > 0 {
		maxOut = min(maxOut, p.maxOutput)
	}
	return timeout, maxOut
}

// ExecListEntry is one command of `exec list`, with the limits it runs
// with here (defaults and the tribe's caps applied).
type ExecListEntry struct {
	Name      string   `json:"name"`
	Argv      []string `json:"argv"`
	Timeout   string   `json:"timeout"` // as Go writes durations: "30s", "1m30s"
	TimeoutMS int64    `json:"timeout_ms"`
	MaxOutput int      `json:"max_output"` // bytes of stdout and of stderr, each
}

// list is the host's commands by name; empty, not null, when it has none.
func (p *execPlugin) list() []ExecListEntry {
	out := []ExecListEntry{}
	table := p.table()
	for _, name := range slices.Sorted(maps.Keys(table.Commands)) {
		cmd := table.Commands[name]
		timeout, maxOut := p.limits(cmd)
		out = append(out, ExecListEntry{Name: name, Argv: cmd.Argv, Timeout: timeout.String(),
			TimeoutMS: timeout.Milliseconds(), MaxOutput: maxOut})
	}
	return out
}

func cmp[T int | int64 | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// run runs argv in its own process group, so a timeout, or the command's
// end, kills whatever it started too, and keeps at most maxOut bytes of
// each output stream.
func run(ctx context.Context, name string, argv []string, timeout time.Duration, maxOut int) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := exec.CommandContext(ctx, argv[0], argv[1:]...)
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	c.WaitDelay = time.Second
	stdout, stderr := &capped{max: maxOut}, &capped{max: maxOut}
	c.Stdout, c.Stderr = stdout, stderr
	start := time.Now()
	err := c.Start()
	if err == nil {
		// What the command left in its group (`cmd &`) would run on past
		// its timeout, and each call of it would leave more; a daemon
		// meant to outlive the command leaves the group (setsid). Killed
		// once the command has ended and before it is reaped, while the
		// group's number is still its own; and so before Wait, which
		// waited for such a child holding the output pipes (WaitDelay).
		if procwait.Exited(c.Process.Pid) == nil {
			syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		}
		err = c.Wait()
	}
	res := ExecResult{Command: name, Argv: argv, Stdout: stdout.String(), Stderr: stderr.String(),
		Truncated: stdout.dropped || stderr.dropped, MS: time.Since(start).Milliseconds()}
	if c.ProcessState != nil {
		res.ExitCode = c.ProcessState.ExitCode()
	}
	b, merr := json.Marshal(res)
	if merr != nil {
		return nil, merr
	}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return b, nil
	case ctx.Err() != nil:
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return b, Errorf(CodeTimeout, "command %s killed after %v", label(name, argv), timeout)
		}
		return b, ctx.Err()
	case errors.As(err, &exitErr):
		return b, Errorf(CodeFailed, "command %s exited with status %d", label(name, argv), res.ExitCode)
	}
	return b, Errorf(CodeFailed, "command %s: %v", label(name, argv), err)
}

func label(name string, argv []string) string {
	if name != "" {
		return name
	}
	return strconv.Quote(argv[0])
}

// capped keeps the first max bytes written to it. The buffer is a field,
// not embedded: an embedded bytes.Buffer's ReadFrom would let io.Copy
// bypass the cap.
type capped struct {
	buf     bytes.Buffer
	max     int
	dropped bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room < len(p) {
		c.dropped = true
		c.buf.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return c.buf.Write(p)
}

func (c *capped) String() string { return c.buf.String() }
