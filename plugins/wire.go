package plugins

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/tribeagent/tribe/internal/growbuf"
	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/plugins/jsonerr"
)

// ProtocolID is the remote-call protocol. A stream carries calls one after
// another: the caller writes a request frame; the callee writes zero or
// more empty heartbeat frames while the call runs, then one response
// frame. The caller then sends the next request on the same stream, or
// closes it; the callee closes a stream that carries no call for
// StreamIdle, and one whose call was refused or carried a frame over
// KeptFrame. A caller that gives up resets the stream, which cancels the
// call on the callee; so does one that sends anything while a call runs
// past watchAfter (a caller waits for the answer before it sends more).
// (Opening a stream per call cost 5–6x a message on a stream kept open:
// BenchmarkCallVsRawStream in node.)
const ProtocolID = "/tribe/call/2.0.0"

// Limits of the protocol.
const (
	// MaxRequestSize caps a request frame (arguments included).
	MaxRequestSize = 1 << 20
	// MaxResponseSize caps a response frame (result included); a bigger
	// result is replaced by a too_large error.
	MaxResponseSize = 4 << 20
	// DefaultTimeout is a call's budget when the request names none.
	DefaultTimeout = 30 * time.Second
	// MaxTimeout caps what a caller may ask for.
	MaxTimeout = 10 * time.Minute
	// Heartbeat is how often the callee says "still working" on a long
	// call; a caller that hears nothing for Silence gives the callee up as
	// gone (crashed, or its connection silently died).
	Heartbeat = time.Second
	Silence   = 6 * time.Second
	// StreamIdle is how long a callee keeps a stream with no call on it;
	// KeptIdle, shorter, how long a caller keeps one for its next call.
	StreamIdle = 30 * time.Second
	KeptIdle   = 20 * time.Second
	// KeptFrame bounds the request and the response of a call whose
	// stream is kept: a stream that carried more keeps the larger window
	// yamux gave it, so it is closed after its call.
	KeptFrame = 64 << 10
)

// carries reports whether a stream may carry another call after resp:
// after a call that ran, not after a refusal (a caller refused has no
// business keeping a stream open on the callee).
func carries(resp Response) bool {
	return resp.OK || resp.Code == CodeFailed || resp.Code == CodeTimeout
}

// heartbeat and silence are Heartbeat and Silence; tests shorten them.
var (
	heartbeat = Heartbeat
	silence   = Silence
)

// Request is one call, as sent on the wire (JSON in a frame).
type Request struct {
	// ID is the caller's name for the call, echoed in the response.
	ID string `json:"id"`
	// Tribe is the tribe the call is made in: the plugin's instance for
	// that tribe answers. Empty (a call to a node by name) means any
	// tribe both sides share in which the plugin is loaded.
	Tribe  string          `json:"tribe,omitempty"`
	Plugin string          `json:"plugin"`
	Method string          `json:"method"`
	Args   json.RawMessage `json:"args,omitempty"`
	// Deadline is how long, in milliseconds from sending, the caller
	// waits; the callee stops the call when it passes. Zero means
	// DefaultTimeout; more than MaxTimeout is cut to it.
	Deadline int64 `json:"deadline"`
}

// Response is a call's answer. An answer with OK false carries Error and
// Code, and may still carry a Result (a command's output and exit code).
type Response struct {
	ID     string          `json:"id"`
	OK     bool            `json:"ok"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
	Code   Code            `json:"code,omitempty"`
	// Duration is how long the call ran on the callee, in nanoseconds.
	Duration time.Duration `json:"duration"`
	// again marks a call FanOut makes again (never on the wire): the
	// caller's own failure to dial the callee in time, or to keep the
	// connection until a stream opened (nothing was sent), or an order
	// whose answer was lost on the way (the node runs an order once and
	// answers it again).
	again bool
}

// Code classifies a failed call.
type Code string

const (
	CodeBadRequest    Code = "bad_request"    // malformed request
	CodeTooLarge      Code = "too_large"      // request or result over its size limit
	CodeUnauthorized  Code = "unauthorized"   // the caller may not call this plugin here
	CodeNotLoaded     Code = "not_loaded"     // the plugin is not loaded (in that tribe) on the callee
	CodeUnknownMethod Code = "unknown_method" // the plugin has no such method
	CodeBusy          Code = "busy"           // the plugin's concurrency limit and queue are full
	CodeTimeout       Code = "timeout"        // the deadline passed
	CodeCanceled      Code = "canceled"       // the caller gave up
	CodeFailed        Code = "failed"         // the plugin returned an error
	CodeUnreachable   Code = "unreachable"    // the caller could not open a stream
	CodeGone          Code = "gone"           // the callee went away mid-call
	CodeBadResponse   Code = "bad_response"   // the callee answered with garbage
)

// Known reports whether c is one of the codes above. A response's code
// comes from the callee: anything else is what another version or a rogue
// made up, and must not become, say, a metric's label as is.
func (c Code) Known() bool {
	switch c {
	case CodeBadRequest, CodeTooLarge, CodeUnauthorized, CodeNotLoaded, CodeUnknownMethod, CodeBusy,
		CodeTimeout, CodeCanceled, CodeFailed, CodeUnreachable, CodeGone, CodeBadResponse:
		return true
	}
	return false
}

// Error is a call failure with its code.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Errorf makes an *Error.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Errors of the framing and decoding.
var (
	ErrFrameTooLarge = errors.New("plugins: frame over the size limit")
	// ErrFrameNoMemory is a frame the stream's memory scope would not
	// hold (the resource manager's limits, see node/limits.go).
	ErrFrameNoMemory = errors.New("plugins: no memory for the frame")
	ErrBadRequest    = errors.New("plugins: bad request")
)

// writeFrame writes one frame: a uvarint length, then the bytes. An empty
// frame is a heartbeat.
func writeFrame(w io.Writer, b []byte) error {
	buf := make([]byte, 0, binary.MaxVarintLen64+len(b))
	buf = binary.AppendUvarint(buf, uint64(len(b)))
	_, err := w.Write(append(buf, b...))
	return err
}

// readFrame reads one frame of at most max bytes. Its buffer grows as the
// bytes arrive, each growth reserved on mem (the stream's scope; nil
// accounts nothing; see growbuf): a peer that announces a megabyte and
// sends three bytes makes this node hold 4 KiB, not a megabyte per
// stream. held stays reserved for the frame: the caller releases it with
// mem.ReleaseMemory(held) once done with the bytes.
func readFrame(r *bufio.Reader, max int, mem growbuf.Memory) (b []byte, held int, err error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		// Only the other side's clean close is io.EOF: a reset stream's
		// error wraps io.EOF too (yamux, when the connection closes).
		if err == io.EOF {
			return nil, 0, io.EOF
		}
		return nil, 0, fmt.Errorf("plugins: frame length: %w", err)
	}
	if n > uint64(max) {
		return nil, 0, fmt.Errorf("%w: %d bytes, the limit is %d", ErrFrameTooLarge, n, max)
	}
	b, held, err = growbuf.Read(r, int(n), mem)
	switch {
	case errors.Is(err, growbuf.ErrNoMemory):
		return nil, 0, fmt.Errorf("%w: %w", ErrFrameNoMemory, err)
	case err != nil:
		return nil, 0, fmt.Errorf("plugins: frame of %d bytes: %w", n, err)
	}
	return b, held, nil
}

// DecodeRequest parses and checks a request frame.
func DecodeRequest(b []byte) (Request, error) {
	var req Request
	if err := json.Unmarshal(b, &req); err != nil {
		return Request{}, fmt.Errorf("%w: %v", ErrBadRequest, jsonerr.Plain(err))
	}
	if err := req.Check(); err != nil {
		return Request{}, err
	}
	return req, nil
}

// Check reports what is wrong with a request.
func (r Request) Check() error {
	switch {
	case len(r.ID) > 64:
		return fmt.Errorf("%w: id of %d bytes, at most 64", ErrBadRequest, len(r.ID))
	case !names.Valid(r.Plugin):
		return fmt.Errorf("%w: plugin name %q", ErrBadRequest, r.Plugin)
	case !names.ValidMethod(r.Method):
		return fmt.Errorf("%w: method name %q", ErrBadRequest, r.Method)
	case r.Tribe != "" && !names.Valid(r.Tribe):
		return fmt.Errorf("%w: tribe name %q", ErrBadRequest, r.Tribe)
	case r.Deadline < 0:
		return fmt.Errorf("%w: negative deadline %d", ErrBadRequest, r.Deadline)
	}
	return nil
}

// Timeout is the budget the request asks for, within the limits.
func (r Request) Timeout() time.Duration {
	if r.Deadline == 0 {
		return DefaultTimeout
	}
	if r.Deadline > MaxTimeout.Milliseconds() {
		return MaxTimeout
	}
	return time.Duration(r.Deadline) * time.Millisecond
}

// DecodeResponse parses a response frame.
func DecodeResponse(b []byte) (Response, error) {
	var resp Response
	if err := json.Unmarshal(b, &resp); err != nil {
		return Response{}, fmt.Errorf("plugins: bad response: %w", err)
	}
	if !resp.OK && resp.Error == "" {
		return Response{}, errors.New("plugins: bad response: not ok and no error")
	}
	return resp, nil
}

// failure makes the response for err.
func failure(id string, err error) Response {
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Code: CodeFailed, Msg: err.Error()}
	}
	return Response{ID: id, Error: e.Msg, Code: e.Code}
}
