package external

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/plugins/external/wire"
)

// Config bounds an external plugin; zero fields take the defaults.
type Config struct {
	Log *slog.Logger
	// MaxAnswer caps one answer line: a plugin that writes more is
	// killed (and restarted), and the call fails saying so.
	MaxAnswer int
	// HandshakeTimeout bounds a start: the plugin must say what it is
	// within it.
	HandshakeTimeout time.Duration
	// KillGrace is how long a call may go past its deadline (or its
	// caller's cancel) before the plugin is taken for hung and killed.
	KillGrace time.Duration
	// StopGrace is how long a stopping plugin has to exit by itself.
	StopGrace time.Duration
	// BackoffMin and BackoffMax bound the wait before a restart, which
	// doubles with each crash inside CrashWindow.
	BackoffMin, BackoffMax time.Duration
	// CrashLimit crashes inside CrashWindow make the plugin report an
	// error (Health) until it stays up.
	CrashLimit  int
	CrashWindow time.Duration
	// OnChange, if set, is called when what Health says may have changed:
	// the process ended or started again, or a crash aged out of the
	// window. The node then says in its record how the plugin is.
	OnChange func()
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.MaxAnswer <= 0 {
		c.MaxAnswer = plugins.MaxResponseSize
	}
	def(&c.HandshakeTimeout, 5*time.Second)
	def(&c.KillGrace, 2*time.Second)
	def(&c.StopGrace, 2*time.Second)
	def(&c.BackoffMin, 100*time.Millisecond)
	def(&c.BackoffMax, 30*time.Second)
	def(&c.CrashWindow, time.Minute)
	if c.CrashLimit <= 0 {
		c.CrashLimit = 5
	}
	if c.OnChange == nil {
		c.OnChange = func() {}
	}
	return c
}

// Plugin is a supervised external plugin: one process, restarted with
// backoff when it exits, killed when a call outlives its deadline by
// KillGrace. It implements plugins.Plugin, and Close stops it.
type Plugin struct {
	path, file string
	cfg        Config

	mu      sync.Mutex
	info    wire.Info
	proc    *process // nil while it restarts
	last    error    // why the last process ended
	crashes []time.Time
	closed  bool
	// stopped ends at Close (stop), a start under way with it; supervised
	// is closed once the supervisor has returned, leaving no process.
	stopped    context.Context
	stop       context.CancelFunc
	supervised chan struct{}

	badLines atomic.Int64 // see BadLines
}

// BadLines counts the lines the plugin wrote that break the protocol
// after its handshake (ignored, and logged at most once a second), over
// all its runs.
func (p *Plugin) BadLines() int64 { return p.badLines.Load() }

// Start runs the plugin at path and waits for its handshake.
func Start(path string, cfg Config) (*Plugin, error) {
	p := &Plugin{path: path, file: filepath.Base(path), cfg: cfg.withDefaults(), supervised: make(chan struct{})}
	p.stopped, p.stop = context.WithCancel(context.Background())
	proc, info, err := p.launch(p.stopped)
	if err != nil {
		p.stop()
		return nil, fmt.Errorf("plugin %s: %w", p.file, err)
	}
	p.proc, p.info = proc, info
	go func() {
		defer close(p.supervised)
		p.supervise(proc)
	}()
	return p, nil
}

// launch starts a process and shakes hands with it, giving up when ctx
// ends.
func (p *Plugin) launch(ctx context.Context) (*process, wire.Info, error) {
	proc, err := startProcess(p.path, p.file, p.cfg.Log, p.cfg.MaxAnswer, &p.badLines)
	if err != nil {
		return nil, wire.Info{}, err
	}
	proc.grace = p.cfg.KillGrace
	ctx, cancel := context.WithTimeout(ctx, p.cfg.HandshakeTimeout)
	defer cancel()
	info, err := proc.handshake(ctx, p.file)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no handshake answer within %v: is it a tribe plugin?", p.cfg.HandshakeTimeout)
		}
		proc.kill()
		<-proc.done
		return nil, wire.Info{}, err
	}
	return proc, info, nil
}

// supervise restarts the plugin each time its process ends, until Close.
func (p *Plugin) supervise(proc *process) {
	for {
		select {
		case <-proc.done:
		case <-p.stopped.Done():
			return
		}
		err := proc.exitErr()
		for {
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				return
			}
			now := time.Now()
			p.proc, p.last = nil, err
			p.crashes = append(p.crashes, now)
			recent := p.recentCrashes(now)
			p.mu.Unlock()
			wait := min(p.cfg.BackoffMin<<min(recent-1, 20), p.cfg.BackoffMax)
			p.cfg.Log.Warn("plugin ended; restarting it", "plugin", p.file, "err", err, "in", wait, "crashes", recent)
			p.cfg.OnChange()
			select {
			case <-time.After(wait):
			case <-p.stopped.Done():
				return
			}
			next, info, lerr := p.launch(p.stopped)
			if lerr != nil {
				err = lerr
				continue
			}
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				next.kill()
				<-next.done
				return
			}
			p.proc, p.info = next, info
			p.mu.Unlock()
			p.cfg.OnChange()
			// Its crashes age out of the window: say so then.
			time.AfterFunc(p.cfg.CrashWindow, p.cfg.OnChange)
			proc = next
			break
		}
	}
}

// recentCrashes drops crashes older than the window and counts the rest.
// Callers hold p.mu.
func (p *Plugin) recentCrashes(now time.Time) int {
	i := 0
	for i < len(p.crashes) && now.Sub(p.crashes[i]) > p.cfg.CrashWindow {
		i++
	}
	p.crashes = p.crashes[i:]
	return len(p.crashes)
}

// current is the running process, nil while it restarts.
func (p *Plugin) current() *process {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proc
}

// Health is nil unless the plugin crashed CrashLimit times inside
// CrashWindow (then it says so, with the last reason) or was stopped. A
// plugin that ended once and is being restarted is healthy: its calls
// meanwhile fail saying why.
func (p *Plugin) Health() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.recentCrashes(time.Now())
	switch {
	case p.closed:
		return errors.New("stopped")
	case n >= p.cfg.CrashLimit:
		return fmt.Errorf("crashed %d times in %v, last: %v", n, p.cfg.CrashWindow, p.last)
	}
	return nil
}

func (p *Plugin) Name() string { return p.file }

func (p *Plugin) Version() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.info.Version
}

func (p *Plugin) Kind() plugins.Kind {
	p.mu.Lock()
	defer p.mu.Unlock()
	return plugins.Kind(p.info.Kind)
}

func (p *Plugin) Methods() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.info.Methods
}

// Call runs method in the plugin's process. At ctx's end the plugin is
// sent a cancel and the call returns; a plugin that has not answered
// KillGrace later is killed (and restarted), so a hung plugin holds
// nothing but its own process.
func (p *Plugin) Call(ctx context.Context, method string, args json.RawMessage) (json.RawMessage, error) {
	p.mu.Lock()
	proc, closed := p.proc, p.closed
	p.mu.Unlock()
	switch {
	case closed:
		return nil, fmt.Errorf("plugin %s is stopped", p.file)
	case proc == nil:
		p.mu.Lock()
		last := p.last
		p.mu.Unlock()
		if err := p.Health(); err != nil {
			return nil, fmt.Errorf("plugin %s is down: %w", p.file, err)
		}
		return nil, fmt.Errorf("plugin %s is restarting after it ended: %w", p.file, last)
	}
	timeout := plugins.DefaultTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	// Whole milliseconds, rounded up: the plugin's deadline never comes
	// before the caller's.
	id, ch, err := proc.send(ctx, wire.MethodCall, wire.CallParams{Method: method, Args: args, TimeoutMS: max((timeout + time.Millisecond - 1).Milliseconds(), 1)}, true)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", p.file, err) // ctx's error, if it ended first
	}
	r, err := proc.await(ctx, ch)
	switch {
	case err != nil && ctx.Err() != nil:
		go func() {
			// The cancel too waits no longer than the grace: a plugin that
			// does not read it is killed with the rest.
			grace, cancel := context.WithTimeout(context.Background(), p.cfg.KillGrace)
			defer cancel()
			proc.send(grace, wire.MethodCancel, wire.CancelParams{ID: id}, false)
			if _, err := proc.await(grace, ch); err != nil && grace.Err() != nil {
				p.cfg.Log.Warn("plugin did not answer a call past its deadline; killed", "plugin", p.file, "method", method, "grace", p.cfg.KillGrace)
				proc.fail(fmt.Errorf("killed: call %d (%s) went %v past its deadline", id, method, p.cfg.KillGrace))
			}
		}()
		return nil, ctx.Err()
	case err != nil:
		return nil, fmt.Errorf("plugin %s ended mid-call: %w", p.file, err)
	case r.Error != nil:
		// It gave up at the deadline it was sent: say so as the
		// caller's context would (whose timer may lag the clock).
		if err := ctx.Err(); err != nil {
			return r.Error.Data, fmt.Errorf("%w: %s", err, r.Error.Message)
		}
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			return r.Error.Data, fmt.Errorf("%w: %s", context.DeadlineExceeded, r.Error.Message)
		}
		return r.Error.Data, errors.New(r.Error.Message)
	}
	return r.Result, nil
}

// Close stops the plugin: it is asked to shut down, and killed if it is
// still running StopGrace later.
func (p *Plugin) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.stop()
	proc := p.proc
	p.mu.Unlock()
	if proc == nil {
		// A start under way ends with stop: nothing runs once the
		// supervisor has returned.
		<-p.supervised
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.StopGrace)
	defer cancel()
	if _, ch, err := proc.send(ctx, wire.MethodShutdown, nil, true); err == nil {
		// Waiting for the answer reads stdout: a plugin blocked writing
		// lines nobody read since the last call can then take it.
		proc.await(ctx, ch)
	}
	proc.stdin.File().Close()
	select {
	case <-proc.done:
	case <-ctx.Done():
		p.cfg.Log.Warn("plugin did not stop by itself; killed", "plugin", p.file, "grace", p.cfg.StopGrace)
		proc.kill()
		<-proc.done
	}
	return nil
}
