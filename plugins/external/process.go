package external

import (
	"bufio"
	"cmp"
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

	"github.com/tribeagent/tribe/internal/procwait"
	"github.com/tribeagent/tribe/internal/rawpipe"
	"github.com/tribeagent/tribe/plugins/external/wire"
)

// process is one run of a plugin executable, in its own process group (so
// a kill takes its children too).
type process struct {
	name    string
	cmd     *exec.Cmd
	log     *slog.Logger
	maxLine int

	// Both pipes are used with raw system calls: a plain read or write
	// wakes Go's system monitor whenever the agent was idle between two
	// calls (see rawpipe).
	wmu   chan struct{} // capacity 1: held while writing a line to stdin
	stdin *rawpipe.Pipe
	// grace is how long a line cut short at its deadline may take to be
	// written whole before the plugin is killed (Config.KillGrace).
	grace time.Duration

	// Answers are read by the calls that wait for them, one at a time:
	// the one holding turn reads stdout until its own answer has come,
	// handing the others' to their channels. A call alone in flight thus
	// reads its own answer: a reader goroutine's hand-off cost 11–19% of
	// a call straight to a minimal Go plugin and 7–8% to pyecho (alternated
	// in one run). Nobody reads while no call (or Close) waits: lines
	// wait in the pipe, and drain reads what is left when the process
	// ends.
	turn    chan struct{} // capacity 1: held while reading stdout
	stdout  *os.File
	br      *bufio.Reader
	partial []byte      // a line begun by a reader whose call ended
	eof     atomic.Bool // stdout ended or broke the protocol: read no more
	rmu     sync.Mutex  // guards readGen, exited and stdout's deadline
	readGen uint64      // which reader an interrupt is meant for
	exited  bool        // the process has ended: reads end by drainWait

	mu      sync.Mutex
	pending map[int64]chan wire.Response
	next    int64
	shaken  bool // a well-formed answer came: the handshake's, the first
	reaped  bool // Wait has returned: kill must not signal its group

	bad      *atomic.Int64 // lines that broke the protocol after the handshake, the plugin's every run
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

// textBusyTries bounds the starts of a plugin refused as "text file
// busy": 10, 20, 40 and 80 ms apart.
const textBusyTries = 5

// startProcess runs the executable at path.
func startProcess(path, name string, log *slog.Logger, maxLine int, bad *atomic.Int64) (*process, error) {
	// Our own pipes, not StdinPipe and friends: stdin and stdout are used
	// with raw system calls (rawpipe), stdout is read by the calls and
	// stderr by the logger, so Wait must not close them under their
	// readers, and reading either must be able to stop at a deadline (a
	// child the plugin left could hold them open for good).
	var ends [6]*os.File // stdin's read and write, stdout's, stderr's
	var err error
	for i := 0; i < len(ends) && err == nil; i += 2 {
		ends[i], ends[i+1], err = os.Pipe()
	}
	stdinR, stdin, stdout, stdoutW, stderr, stderrW := ends[0], ends[1], ends[2], ends[3], ends[4], ends[5]
	var cmd *exec.Cmd
	for attempt := 0; err == nil; attempt++ {
		cmd = exec.Command(path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Env = pluginEnv(name)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, stdoutW, stderrW
		err = cmd.Start()
		// "text file busy": a child this process forked elsewhere (an
		// exec command, another plugin) just as the file was written
		// (a shared plugin installed a moment ago) holds it open for
		// writing until that child execs (golang/go#22315). It passes.
		if !errors.Is(err, syscall.ETXTBSY) || attempt == textBusyTries-1 {
			break
		}
		err = nil
		time.Sleep(time.Duration(10<<attempt) * time.Millisecond)
	}
	for _, f := range []*os.File{stdinR, stdoutW, stderrW} { // the child's ends
		if f != nil {
			f.Close()
		}
	}
	var in, out *rawpipe.Pipe
	if err == nil {
		if in, out = rawpipe.FromFile(stdin), rawpipe.FromFile(stdout); in == nil || out == nil {
			// Cannot happen: os.Pipe's files are pollable.
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			cmd.Wait()
			err = errors.New("its pipes cannot be polled")
		}
	}
	if err != nil {
		for _, f := range []*os.File{stdin, stdout, stderr} {
			if f != nil {
				f.Close()
			}
		}
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	p := &process{name: name, cmd: cmd, log: log, maxLine: maxLine, bad: bad, stdin: in, wmu: make(chan struct{}, 1),
		turn: make(chan struct{}, 1), stdout: stdout, br: bufio.NewReaderSize(out, 64<<10),
		pending: map[int64]chan wire.Response{}, done: make(chan struct{})}
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		p.logStderr(stderr)
	}()
	go func() {
		// Ended but not reaped, the plugin's process group number is
		// still its own: what it left running in the group (a child in
		// the background) is killed now, or it would outlive the
		// plugin, holding its pipes open.
		if procwait.Exited(cmd.Process.Pid) == nil {
			p.mu.Lock()
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			p.reaped = true // no kill from now on: Wait frees the group's number
			p.mu.Unlock()
		}
		err := cmd.Wait()
		p.mu.Lock()
		p.reaped = true
		p.mu.Unlock()
		p.stdin.File().Close() // the plugin is gone: a write from now on fails
		p.drain()
		// What it wrote to stderr before it ended, for no longer than
		// drainWait: a child that left the group (setsid) may hold the
		// pipe open.
		stderr.SetReadDeadline(time.Now().Add(drainWait))
		<-logged
		stderr.Close()
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

// await waits for the answer on ch (from send), reading stdout itself
// whenever no other call is. It returns ctx's error when ctx ends first,
// and the reason the process ended if it ends first.
func (p *process) await(ctx context.Context, ch chan wire.Response) (wire.Response, error) {
	for {
		turn := p.turn
		if p.eof.Load() {
			turn = nil // nothing more to read: the process is ending
		}
		select {
		case r, ok := <-ch:
			if !ok {
				return wire.Response{}, p.exitErr()
			}
			return r, nil
		case <-ctx.Done():
			return wire.Response{}, ctx.Err()
		case turn <- struct{}{}:
			p.readTurn(ctx, ch)
			select {
			case r, ok := <-ch:
				if !ok {
					return wire.Response{}, p.exitErr()
				}
				return r, nil
			default:
			}
			if err := ctx.Err(); err != nil {
				return wire.Response{}, err
			}
		}
	}
}

// readTurn reads for ch (see readFor) with the turn the caller took, and
// gives the turn back.
func (p *process) readTurn(ctx context.Context, ch chan wire.Response) {
	defer func() { <-p.turn }()
	p.readFor(ctx, ch)
}

// readFor reads answers, handing each to its call, until one is on ch,
// ctx ends, or stdout can be read no more. The caller holds the turn.
func (p *process) readFor(ctx context.Context, ch chan wire.Response) {
	p.rmu.Lock()
	p.readGen++
	gen, exited := p.readGen, p.exited
	p.rmu.Unlock()
	if exited {
		return // drain reads what is left
	}
	stop := context.AfterFunc(ctx, func() { p.interrupt(gen) })
	defer func() {
		stop()
		p.rmu.Lock()
		p.readGen++
		if !p.exited {
			p.stdout.SetReadDeadline(time.Time{})
		}
		p.rmu.Unlock()
	}()
	err := p.takeLines(func() bool { return len(ch) > 0 })
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) { // not ctx's end, nor the process's
		p.stopReading(err)
	}
}

// takeLines hands out answer lines until enough says so or stdout can be
// read no more, and returns the read error that stopped it, if any. The
// caller holds the turn.
func (p *process) takeLines(enough func() bool) error {
	for !enough() && !p.eof.Load() {
		line, err := p.readLine()
		if line == nil {
			return err
		}
		p.take(line)
	}
	return nil
}

// errTooLong is the error of a process that wrote a line over the limit.
func (p *process) errTooLong() error {
	return fmt.Errorf("%w: an answer over %d bytes", wire.ErrProtocol, p.maxLine)
}

// interrupt makes the reader of generation gen stop waiting for stdout.
func (p *process) interrupt(gen uint64) {
	p.rmu.Lock()
	defer p.rmu.Unlock()
	if p.readGen == gen && !p.exited { // once exited, drain owns the deadline
		p.stdout.SetReadDeadline(time.Now())
	}
}

// readLine reads one whole line, or returns an error and keeps what it
// read of a line for the next reader.
func (p *process) readLine() ([]byte, error) {
	for {
		frag, err := p.br.ReadSlice('\n')
		if len(p.partial)+len(frag) > p.maxLine {
			return nil, errLineTooLong
		}
		p.partial = append(p.partial, frag...)
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF && len(p.partial) > 0:
			// A last line without its newline; the next read says EOF.
		case err != nil:
			return nil, err
		}
		line := p.partial
		p.partial = nil
		return line, nil
	}
}

// stopReading ends reading stdout for err: a line over the limit breaks
// the protocol, and the process is killed with that error. At any other
// error (EOF: the process is ending, or it closed its stdout) it cannot
// answer any more: if it has not ended closedStdoutGrace later, it is
// killed, saying why.
func (p *process) stopReading(err error) {
	p.eof.Store(true)
	if errors.Is(err, errLineTooLong) {
		p.fail(p.errTooLong())
		return
	}
	go func() {
		t := time.NewTimer(closedStdoutGrace)
		defer t.Stop()
		select {
		case <-p.done:
		case <-t.C:
			p.fail(fmt.Errorf("%w: it closed its stdout (%v) and cannot answer", wire.ErrProtocol, err))
		}
	}()
}

// closedStdoutGrace is how long a process whose stdout ended may take to
// exit by itself before it is killed.
const closedStdoutGrace = time.Second

// drainWait bounds reading what a process wrote before it ended (a child
// it left could hold its stdout open).
const drainWait = 100 * time.Millisecond

// drain hands out the answers the process wrote before it ended, so a
// call answered just before a crash or a shutdown gets its answer.
func (p *process) drain() {
	p.rmu.Lock()
	p.exited = true
	p.stdout.SetReadDeadline(time.Now()) // a call reading now gives the turn up
	p.rmu.Unlock()
	p.turn <- struct{}{}
	p.stdout.SetReadDeadline(time.Now().Add(drainWait))
	if err := p.takeLines(func() bool { return false }); errors.Is(err, errLineTooLong) {
		p.mu.Lock()
		if p.err == nil { // the process is gone: nothing to kill
			p.err = p.errTooLong()
		}
		p.mu.Unlock()
	}
	p.eof.Store(true)
	p.stdout.Close()
	<-p.turn
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
	if errors.Is(sc.Err(), bufio.ErrTooLong) {
		p.log.Warn("a plugin wrote a stderr line over 16 KiB; the rest of its stderr is not logged", "plugin", p.name)
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
	p.mu.Lock()
	defer p.mu.Unlock()
	// Once reaped, its process group's number could name another's.
	if p.cmd.Process != nil && !p.reaped {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// exitErr is why the process ended (after done is closed).
func (p *process) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// send writes a request, waiting no longer than ctx (see writeLine); with
// an id, the answer comes on the channel.
func (p *process) send(ctx context.Context, method string, params any, wantAnswer bool) (int64, chan wire.Response, error) {
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
	if err := p.writeLine(ctx, wire.EncodeRequest(req)); err != nil {
		p.forget(id)
		return 0, nil, fmt.Errorf("writing to the plugin: %w", err)
	}
	return id, ch, nil
}

// writeLine writes one line to stdin, one writer at a time, for no longer
// than ctx lasts. A plugin that stops reading (one that takes a call at a
// time, busy or hung) fills its pipe (64 KiB), and a request may be 1 MiB:
// an unbounded write held the call past its deadline, the cancel and the
// shutdown behind it, and so the unload and the agent's stop. A line cut
// short would break the protocol: it gets grace more to be written whole
// (a plugin that takes one call at a time may be busy in a healthy one,
// and a call past its deadline gets as long to answer), then the process
// is killed (and restarted). A line not begun has no consequence: the plugin's pipe is full of lines it did
// not read, and the calls among them get it killed KillGrace after their
// deadlines (a write that found the deadline passed says nothing of the
// plugin).
func (p *process) writeLine(ctx context.Context, b []byte) error {
	select {
	case p.wmu <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-p.wmu }()
	if err := ctx.Err(); err != nil {
		return err
	}
	f := p.stdin.File()
	if dl, ok := ctx.Deadline(); ok {
		f.SetWriteDeadline(dl)
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		f.SetWriteDeadline(time.Now())
		close(fired)
	})
	n, err := p.stdin.Write(b)
	if !stop() {
		<-fired // its deadline must not fall on the next line
	}
	f.SetWriteDeadline(time.Time{})
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return err // nil, or the process has ended or is being stopped
	}
	// Only ctx sets the deadline; its timer may lag the clock.
	err = cmp.Or(ctx.Err(), context.DeadlineExceeded)
	if n > 0 {
		if errors.Is(err, context.DeadlineExceeded) {
			// Grace, as for a call past its deadline; a cancelled
			// one (the agent stopping) is not waited for.
			f.SetWriteDeadline(time.Now().Add(p.grace))
			m, werr := p.stdin.Write(b[n:])
			f.SetWriteDeadline(time.Time{})
			if werr == nil {
				return err // whole, late: the call's deadline passed
			}
			if !errors.Is(werr, os.ErrDeadlineExceeded) {
				return err // the process ended meanwhile: nothing to kill
			}
			n += m
		}
		p.log.Warn("a plugin did not read its stdin; killed", "plugin", p.name, "written", n, "of", len(b))
		p.fail(fmt.Errorf("killed: it did not read its stdin (%d of a %d-byte line written)", n, len(b)))
	}
	return err
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
	id, ch, err := p.send(ctx, method, params, true)
	if err != nil {
		return wire.Response{}, err
	}
	r, err := p.await(ctx, ch)
	if err != nil && ctx.Err() != nil {
		p.forget(id)
	}
	return r, err
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
