package external

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tribeagent/tribe/plugins/external/wire"
)

// process is one run of a plugin executable, in its own process group (so
// a kill takes its children too).
type process struct {
	name    string
	cmd     *exec.Cmd
	log     *slog.Logger
	maxLine int

	wmu   sync.Mutex // one line at a time to stdin
	stdin io.WriteCloser

	mu      sync.Mutex
	pending map[int64]chan wire.Response
	next    int64
	shaken  bool // a well-formed answer came: the handshake's, the first

	bad      atomic.Int64  // lines that broke the protocol after the handshake
	lastWarn atomic.Int64  // when one was last logged, unix nanoseconds
	done     chan struct{} // closed once the process has exited
	err      error         // why it ended; set before done closes
}

// passedEnv is what a plugin gets of the agent's environment: enough to
// find programs and write files, nothing the agent was given for itself
// (tokens, keys in the environment stay with it).
var passedEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR"}

// pluginEnv is a plugin process's environment: passedEnv, plus its name
// and the protocol version.
func pluginEnv(name string) []string {
	var env []string
	for _, k := range passedEnv {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return append(env, "TRIBE_PLUGIN="+name, fmt.Sprintf("TRIBE_PLUGIN_PROTOCOL=%d", wire.Protocol))
}

// errExited is the error of a call the process did not answer.
var errExited = errors.New("the plugin exited")

// startProcess runs the executable at path.
func startProcess(path, name string, log *slog.Logger, maxLine int) (*process, error) {
	cmd := exec.Command(path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = pluginEnv(name)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	p := &process{name: name, cmd: cmd, log: log, maxLine: maxLine, stdin: stdin,
		pending: map[int64]chan wire.Response{}, done: make(chan struct{})}
	var readers sync.WaitGroup
	readers.Go(func() { p.readAnswers(stdout) })
	readers.Go(func() { p.logStderr(stderr) })
	go func() {
		readers.Wait()
		err := cmd.Wait()
		p.mu.Lock()
		if p.err == nil {
			p.err = fmt.Errorf("%w (%v)", errExited, err)
			if err == nil {
				p.err = fmt.Errorf("%w (status 0)", errExited)
			}
		}
		pending := p.pending
		p.pending = nil
		p.mu.Unlock()
		for _, ch := range pending {
			close(ch)
		}
		close(p.done)
	}()
	return p, nil
}

// readAnswers hands each answer line to the call waiting for it.
func (p *process) readAnswers(stdout io.Reader) {
	br := bufio.NewReaderSize(stdout, 64<<10)
	for {
		line, err := readLine(br, p.maxLine)
		if errors.Is(err, errLineTooLong) {
			p.fail(fmt.Errorf("%w: an answer over %d bytes", wire.ErrProtocol, p.maxLine))
			io.Copy(io.Discard, stdout) // until the kill closes it
			return
		}
		if len(line) > 0 {
			p.take(line)
		}
		if err != nil {
			return
		}
	}
}

// take routes one answer line.
func (p *process) take(line []byte) {
	r, err := wire.DecodeResponse(line)
	p.mu.Lock()
	shaken := p.shaken
	var ch chan wire.Response
	if err == nil {
		p.shaken = true
		ch = p.pending[r.ID]
		delete(p.pending, r.ID)
	}
	p.mu.Unlock()
	switch {
	case err != nil && !shaken:
		// Garbage before the handshake: not a plugin of this protocol.
		p.fail(err)
	case err != nil:
		// Ignored, and logged at most once a second with the count so far.
		bad, now := p.bad.Add(1), time.Now().UnixNano()
		if last := p.lastWarn.Load(); now-last >= int64(time.Second) && p.lastWarn.CompareAndSwap(last, now) {
			p.log.Warn("a plugin wrote a line that is not a JSON-RPC answer; ignored", "plugin", p.name, "err", err, "bad_lines", bad)
		}
	case ch != nil:
		ch <- r
	}
}

// logStderr puts each line the plugin writes to stderr in the agent's
// log, at most stderrBurst at once and stderrPerSecond after that: a
// plugin that floods stderr loses lines (said in the log, with how many),
// not the agent its log.
func (p *process) logStderr(stderr io.Reader) {
	sc := bufio.NewScanner(stderr)
	sc.Buffer(make([]byte, 4096), 16<<10)
	tokens, last, dropped := float64(stderrBurst), time.Now(), 0
	for sc.Scan() {
		now := time.Now()
		tokens = min(stderrBurst, tokens+now.Sub(last).Seconds()*stderrPerSecond)
		last = now
		if tokens < 1 {
			dropped++
			continue
		}
		tokens--
		if dropped > 0 {
			p.log.Warn("plugin stderr lines dropped: it writes faster than the log takes", "plugin", p.name, "dropped", dropped)
			dropped = 0
		}
		p.log.Info("plugin stderr", "plugin", p.name, "line", sc.Text())
	}
	if dropped > 0 {
		p.log.Warn("plugin stderr lines dropped: it writes faster than the log takes", "plugin", p.name, "dropped", dropped)
	}
	io.Copy(io.Discard, stderr) // past an overlong line
}

// How many stderr lines of one plugin process reach the log.
const (
	stderrBurst     = 100
	stderrPerSecond = 20
)

// fail ends the process for err: its calls get err.
func (p *process) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
	p.kill()
}

// kill ends the process group at once.
func (p *process) kill() {
	if p.cmd.Process != nil {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// exitErr is why the process ended (after done is closed).
func (p *process) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// send writes a request; with an id, the answer comes on the channel.
func (p *process) send(method string, params any, wantAnswer bool) (int64, chan wire.Response, error) {
	req := wire.Request{Method: method, Params: params}
	var ch chan wire.Response
	p.mu.Lock()
	if p.pending == nil {
		p.mu.Unlock()
		return 0, nil, p.exitErr()
	}
	id := p.next
	if wantAnswer {
		p.next++
		req.ID = &id
		ch = make(chan wire.Response, 1)
		p.pending[id] = ch
	}
	p.mu.Unlock()
	p.wmu.Lock()
	_, err := p.stdin.Write(wire.EncodeRequest(req))
	p.wmu.Unlock()
	if err != nil {
		p.forget(id)
		return 0, nil, fmt.Errorf("writing to the plugin: %w", err)
	}
	return id, ch, nil
}

func (p *process) forget(id int64) {
	p.mu.Lock()
	if p.pending != nil {
		delete(p.pending, id)
	}
	p.mu.Unlock()
}

// roundTrip sends a request and waits for its answer, the process's end,
// or ctx.
func (p *process) roundTrip(ctx context.Context, method string, params any) (wire.Response, error) {
	id, ch, err := p.send(method, params, true)
	if err != nil {
		return wire.Response{}, err
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return wire.Response{}, p.exitErr()
		}
		return r, nil
	case <-ctx.Done():
		p.forget(id)
		return wire.Response{}, ctx.Err()
	}
}

// handshake asks the plugin what it is.
func (p *process) handshake(ctx context.Context, file string) (wire.Info, error) {
	r, err := p.roundTrip(ctx, wire.MethodHandshake, wire.HandshakeParams{Protocol: wire.Protocol})
	if err != nil {
		return wire.Info{}, err
	}
	if r.Error != nil {
		return wire.Info{}, fmt.Errorf("%w: the plugin refused the handshake: %s", wire.ErrProtocol, r.Error.Message)
	}
	in, err := wire.DecodeInfo(r.Result, file)
	if err != nil {
		return wire.Info{}, err
	}
	return in, nil
}

// errLineTooLong is a line over the reader's limit.
var errLineTooLong = errors.New("line too long")

// readLine reads one line of at most max bytes (the newline included).
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > max {
			return nil, errLineTooLong
		}
		line = append(line, frag...)
		if err == bufio.ErrBufferFull {
			continue
		}
		return line, err
	}
}
