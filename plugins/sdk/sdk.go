// Package sdk turns a Go type into a tribe external plugin: an executable
// that speaks the protocol of package external on its stdin and stdout.
//
//	type Hello struct{}
//
//	func (Hello) Echo(ctx context.Context, args json.RawMessage) (json.RawMessage, error) { return args, nil }
//	func (Hello) Greet(ctx context.Context, a struct{ Name string }) (string, error) { return "hello " + a.Name, nil }
//
//	func main() { sdk.Main(sdk.Info{Name: "hello", Version: "1.0.0", Kind: "processor"}, Hello{}) }
//
// Every exported method of the form func(context.Context, A) (R, error) is
// a plugin method, named with its first letter in lower case (Echo is
// "echo"). A is decoded from the call's JSON arguments (json.RawMessage
// takes them as they are; unknown fields are refused), R is encoded as the
// result. ctx ends at the call's deadline or when the agent cancels it.
// Calls run concurrently. What the plugin writes to stderr goes to the
// agent's log; stdout is the protocol's.
package sdk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tribeagent/tribe/internal/rawpipe"
	"github.com/tribeagent/tribe/plugins/external/wire"
)

// Info says what the plugin is. Name must be the executable's file name;
// empty, it is that name (so one binary can be installed under another).
type Info struct {
	Name    string
	Version string
	Kind    string // collector, processor, publisher or action
	// Procs is how many cores the plugin's Go code may use at once (Go's
	// GOMAXPROCS, set by Main whatever the environment says; Serve leaves
	// it alone); 0 means 1. Calls still run concurrently on one core:
	// a plugin is a helper on a host that runs something else, and on one
	// core a call's round trip is 10–15% shorter (no hand-off of the call
	// between threads; measured against Go's default on 2 cores, one run).
	// Set it higher for methods that compute in parallel.
	Procs int
}

// Main serves impl on stdin and stdout and exits: 0 when the agent stops
// it, 1 (saying why on stderr) if impl is not a plugin or if a call has
// not returned endGrace after the input ended.
func Main(info Info, impl any) {
	if info.Name == "" {
		info.Name = filepath.Base(os.Args[0])
	}
	runtime.GOMAXPROCS(max(info.Procs, 1))
	if err := serve(info, impl, stdio(0, "stdin"), stdio(1, "stdout"), endGrace); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// stdio is fd as a rawpipe.Pipe (the agent gives a plugin pipes), else as a
// file Go's poller waits on if it can: either way the goroutine that
// reads requests parks instead of holding a thread in a blocking read.
// Measured against the blocking stdin, alternated in one run: 118–143 µs
// a call instead of 147–169.
func stdio(fd int, name string) io.ReadWriter {
	if p := rawpipe.FromFD(fd, name); p != nil {
		return p
	}
	syscall.SetNonblock(fd, true)
	return os.NewFile(uintptr(fd), name)
}

type method func(ctx context.Context, args json.RawMessage) (any, error)

var (
	ctxType = reflect.TypeFor[context.Context]()
	errType = reflect.TypeFor[error]()
	rawType = reflect.TypeFor[json.RawMessage]()
)

// methods are impl's plugin methods by name.
func methods(impl any) (map[string]method, error) {
	// Each method is called as its method expression with impl as the
	// receiver, and ctx as a context.Context already: a bound method
	// value and a *callCtx cost reflect a receiver look-up and an
	// interface check on every call (in profiles of hello, reflect's
	// share of the plugin's CPU went from 12% to 8%).
	recv := reflect.ValueOf(impl)
	out := map[string]method{}
	for i := range recv.NumMethod() {
		mt := recv.Type().Method(i)
		fn, t := mt.Func, mt.Func.Type() // func(receiver, context.Context, A) (R, error)
		if t.NumIn() != 3 || t.In(1) != ctxType || t.NumOut() != 2 || t.Out(1) != errType {
			continue
		}
		r, size := utf8.DecodeRuneInString(mt.Name)
		name := string(unicode.ToLower(r)) + mt.Name[size:]
		argType := t.In(2)
		out[name] = func(ctx context.Context, args json.RawMessage) (any, error) {
			in := [3]reflect.Value{recv, reflect.ValueOf(&ctx).Elem()}
			if argType == rawType { // as they came: JSON the agent checked
				in[2] = reflect.ValueOf(args)
			} else {
				a := reflect.New(argType)
				if len(args) > 0 {
					d := json.NewDecoder(bytes.NewReader(args))
					d.DisallowUnknownFields()
					if err := d.Decode(a.Interface()); err != nil {
						return nil, fmt.Errorf("arguments of %s: %w", name, err)
					}
				}
				in[2] = a.Elem()
			}
			res := fn.Call(in[:])
			err, _ := res[1].Interface().(error)
			return res[0].Interface(), err
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("sdk: %T has no method of the form func(context.Context, A) (R, error)", impl)
	}
	return out, nil
}

// request is a message from the agent, its params those of any method
// (decoded in one pass: a call's round trip is mostly such work).
type request struct {
	JSONRPC string `json:"jsonrpc"`
	ID      *int64 `json:"id"`
	Method  string `json:"method"`
	Params  struct {
		Method    string          `json:"method"`     // tribe.call
		Args      json.RawMessage `json:"args"`       // tribe.call
		TimeoutMS int64           `json:"timeout_ms"` // tribe.call
		ID        int64           `json:"id"`         // tribe.cancel
	} `json:"params"`
}

// Serve speaks the protocol on in and out until in ends or the agent asks
// the plugin to shut down; calls still running are cancelled, and waited
// for however long they take: a call left running would write its answer
// to out after Serve returned, and the caller may use out for something
// else by then. Main, which exits, waits endGrace at most.
func Serve(info Info, impl any, in io.Reader, out io.Writer) error {
	return serve(info, impl, in, out, 0)
}

// endGrace is how long Main waits, once its input ended, for the calls it
// cancelled to return. Without it a method that ignores its context kept
// the process running for good after its agent had gone. A living agent
// that stops a plugin kills it after its own 2 s (external.Config's
// StopGrace), so the grace matters only to a plugin whose agent is gone.
const endGrace = 2 * time.Second

// serve is Serve, waiting at most grace (0: for good) for the calls still
// running once reading ends.
func serve(info Info, impl any, in io.Reader, out io.Writer, grace time.Duration) error {
	ms, err := methods(impl)
	if err != nil {
		return err
	}
	s := &server{info: info, methods: ms, out: out, running: map[int64]*callCtx{},
		work: make(chan func()), quit: make(chan struct{})}
	s.br, s.ended = bufio.NewReaderSize(in, 64<<10), make(chan error, 1)
	// Reading starts on a worker: the goroutine that reads the first
	// call answers it, and this one must be free to cancel the calls
	// still running when reading ends.
	s.reader = s.readRequests
	s.run(s.reader)
	err = <-s.ended
	s.cancelAll()
	close(s.quit)
	if !s.waitWorkers(grace) {
		return fmt.Errorf("sdk: a call was still running %v after the input ended (its method ignores its context); exiting without it", grace)
	}
	return err
}

// waitWorkers waits for the workers, and so for the calls they run, for
// at most grace (0: for good), and reports whether they all ended.
func (s *server) waitWorkers(grace time.Duration) bool {
	if grace == 0 {
		s.wg.Wait()
		return true
	}
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// readRequests reads and handles requests until one is a call, or the
// input ends, or the agent asks the plugin to shut down (then it says so
// on ended). A call it answers itself, once another goroutine reads on:
// the answer goes out before this one waits for the next request. A
// call handed to a worker waited for the reader to go back to the pipe
// and park: a call to the example hello against a built-in's was 1.63x–
// 1.69x so, 1.54x–1.59x with the hand-off of reading (four alternated
// runs, 2026-11-27).
func (s *server) readRequests() {
	for {
		line, err := readLine(s.br)
		if len(bytes.TrimSpace(line)) > 0 {
			call, stop := s.handle(line)
			switch {
			case stop:
				s.ended <- nil
				return
			case call != nil:
				s.run(s.reader)
				call.run()
				return
			}
		}
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			s.ended <- err
			return
		}
	}
}

// readLine is the next line of br (with its newline, unless the input
// ended without one), valid until the next read: a request is decoded
// before the next is read, and what a call keeps of it (its arguments)
// is a copy.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != bufio.ErrBufferFull {
		return line, err
	}
	long := bytes.Clone(line)
	for err == bufio.ErrBufferFull {
		line, err = br.ReadSlice('\n')
		long = append(long, line...)
	}
	return long, err
}

type server struct {
	info    Info
	methods map[string]method
	br      *bufio.Reader // read by one goroutine at a time (readRequests)
	ended   chan error    // why reading ended: nil at EOF or shutdown
	wmu     sync.Mutex
	out     io.Writer
	mu      sync.Mutex
	running map[int64]*callCtx // each call in progress, to cancel
	reader  func()             // readRequests, as a value made once
	calls   sync.WaitGroup     // calls in progress
	wg      sync.WaitGroup     // workers

	// Calls run on workers that outlive them: a new goroutine per call
	// grew (copied) its stack on every call, 12% of a plugin's CPU in a
	// profile (50–57 µs a call with workers against 57–60, three runs
	// each). idle counts the workers waiting for a call, at most
	// maxIdleWorkers.
	work chan func()
	quit chan struct{}
	idle atomic.Int32
}

// maxIdleWorkers bounds the workers kept waiting for calls: past it a
// worker whose call ended exits.
const maxIdleWorkers = 4

// run runs f on an idle worker, or on a new one if none is idle: calls
// stay concurrent.
func (s *server) run(f func()) {
	select {
	case s.work <- f:
	default:
		s.wg.Go(func() {
			f()
			s.worker()
		})
	}
}

// worker takes calls until enough other workers are idle or the server
// ends.
func (s *server) worker() {
	for {
		if s.idle.Add(1) > maxIdleWorkers {
			s.idle.Add(-1)
			return
		}
		select {
		case f := <-s.work:
			s.idle.Add(-1)
			f()
		case <-s.quit:
			s.idle.Add(-1)
			return
		}
	}
}

// handle acts on one request, but for a call, which it returns to run;
// it reports whether to stop.
func (s *server) handle(line []byte) (call *pending, stop bool) {
	if id, p, ok := wire.ParseCall(line); ok { // a call as the agent writes it
		return s.start(id, p.Method, p.Args, p.TimeoutMS), false
	}
	var req request
	if err := json.Unmarshal(line, &req); err != nil || req.JSONRPC != "2.0" {
		fmt.Fprintf(os.Stderr, "sdk: not a JSON-RPC 2.0 request: %q\n", line)
		return nil, false
	}
	switch req.Method {
	case wire.MethodHandshake:
		names := make([]string, 0, len(s.methods))
		for n := range s.methods {
			names = append(names, n)
		}
		slices.Sort(names)
		s.answer(req.ID, wire.Info{Protocol: wire.Protocol, Name: s.info.Name, Version: s.info.Version,
			Kind: s.info.Kind, Methods: names}, nil)
	case wire.MethodCall:
		if req.ID == nil {
			return nil, false // a notification: nobody waits for the answer
		}
		p := req.Params
		return s.start(*req.ID, p.Method, p.Args, p.TimeoutMS), false
	case wire.MethodCancel:
		s.mu.Lock()
		if ctx, ok := s.running[req.Params.ID]; ok {
			ctx.cancel()
		}
		s.mu.Unlock()
	case wire.MethodShutdown:
		s.cancelAll()
		s.calls.Wait()
		s.answer(req.ID, nil, nil)
		return nil, true
	default:
		s.answer(req.ID, nil, fmt.Errorf("unknown method %q", req.Method))
	}
	return nil, false
}

// pending is a call to run: one allocation for its context and all its
// answer needs (closures and a context of its own were four).
type pending struct {
	s    *server
	id   int64
	ctx  callCtx
	m    method
	args json.RawMessage
}

// start registers call id of method (so that a cancel finds it) and
// returns it to run; a method the plugin does not have is answered at
// once, and nil returned.
func (s *server) start(id int64, method string, args json.RawMessage, timeoutMS int64) *pending {
	m, ok := s.methods[method]
	if !ok {
		s.answer(&id, nil, fmt.Errorf("no method %q", method))
		return nil
	}
	c := &pending{s: s, id: id, m: m, args: args}
	c.ctx.deadline = time.Now().Add(time.Duration(max(timeoutMS, 1)) * time.Millisecond)
	s.mu.Lock()
	s.running[id] = &c.ctx
	s.mu.Unlock()
	s.calls.Add(1)
	return c
}

// run runs the call and answers it.
func (c *pending) run() {
	s := c.s
	defer s.calls.Done()
	res, err := s.call(&c.ctx, c.m, c.args)
	s.mu.Lock()
	delete(s.running, c.id)
	s.mu.Unlock()
	c.ctx.cancel()
	s.answer(&c.id, res, err)
}

// call runs one method, a panic included.
func (s *server) call(ctx context.Context, m method, args json.RawMessage) (res any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the method panicked: %v", r)
		}
	}()
	return m(ctx, args)
}

func (s *server) cancelAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ctx := range s.running {
		ctx.cancel()
	}
}

// answer writes the response to a request with an id.
func (s *server) answer(id *int64, res any, err error) {
	if id == nil {
		return
	}
	b := append(make([]byte, 0, 256), `{"jsonrpc":"2.0","id":`...)
	b = strconv.AppendInt(b, *id, 10)
	out, merr := encode(res)
	switch {
	case err == nil && merr == nil:
		b = append(append(append(b, `,"result":`...), out...), '}')
	case err == nil:
		b = appendError(b, "encoding the result: "+merr.Error(), nil)
	case merr == nil && string(out) != "null":
		b = appendError(b, err.Error(), out)
	default:
		b = appendError(b, err.Error(), nil)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.out.Write(append(b, '\n'))
}

// appendError appends an error member and closes the response.
func appendError(b []byte, msg string, data json.RawMessage) []byte {
	if msg == "" { // errors.New("")
		msg = wire.NoMessage
	}
	e, _ := json.Marshal(wire.RPCError{Code: 1, Message: msg, Data: data})
	return append(append(append(b, `,"error":`...), e...), '}')
}

// encode is a method's result as JSON on one line; a json.RawMessage is
// taken as it is once checked (the common case of a plugin that passes
// JSON through), compacted if it has a line break (whitespace in JSON).
func encode(res any) ([]byte, error) {
	if raw, ok := res.(json.RawMessage); ok && raw != nil {
		if !json.Valid(raw) {
			return nil, errors.New("the result is not valid JSON")
		}
		if bytes.ContainsAny(raw, "\r\n") {
			var b bytes.Buffer
			json.Compact(&b, raw)
			return b.Bytes(), nil
		}
		return raw, nil
	}
	return json.Marshal(res)
}
