// Package wire is the protocol between the agent and an external plugin
// (package external runs them, package sdk writes them in Go): its
// messages, their encoding and their strict decoding. It does no I/O.
//
// The protocol, version 1. Each message is one JSON object on one line.
//
//	agent  {"jsonrpc":"2.0","id":0,"method":"tribe.handshake","params":{"protocol":1}}
//	plugin {"jsonrpc":"2.0","id":0,"result":{"protocol":1,"name":"hello","version":"1.0.0","kind":"processor","methods":["echo"]}}
//	agent  {"jsonrpc":"2.0","id":1,"method":"tribe.call","params":{"method":"echo","timeout_ms":30000,"args":{"a":1}}}
//	plugin {"jsonrpc":"2.0","id":1,"result":{"a":1}}
//	plugin {"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"what went wrong","data":<partial result>}}
//	agent  {"jsonrpc":"2.0","method":"tribe.cancel","params":{"id":1}}   (a notification: no answer)
//	agent  {"jsonrpc":"2.0","id":2,"method":"tribe.shutdown"}          (answer, then exit; or exit at EOF)
//
// Calls may be answered in any order; a plugin that handles one at a time
// is fine (the agent bounds how many it sends at once).
package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/internal/strictjson"
)

// Protocol is the protocol version this agent speaks.
const Protocol = 1

// The methods the agent calls.
const (
	MethodHandshake = "tribe.handshake"
	MethodCall      = "tribe.call"
	MethodCancel    = "tribe.cancel"
	MethodShutdown  = "tribe.shutdown"
)

// ErrProtocol is what a plugin that breaks the protocol gets.
var ErrProtocol = errors.New("external plugin: protocol")

// Request is a message from the agent.
type Request struct {
	JSONRPC string `json:"jsonrpc"`
	ID      *int64 `json:"id,omitempty"` // nil for a notification
	Method  string `json:"method"`
	Params  any    `json:"params,omitempty"`
}

// HandshakeParams are what the agent offers.
type HandshakeParams struct {
	Protocol int `json:"protocol"`
}

// Info is what a plugin says it is, in its handshake answer.
type Info struct {
	Protocol int      `json:"protocol"`
	Name     string   `json:"name"`
	Version  string   `json:"version"`
	Kind     string   `json:"kind"`
	Methods  []string `json:"methods"`
}

// CallParams ask the plugin to run one of its methods.
// The agent writes the arguments last (a plugin that reads the line as
// the agent writes it finds them at its end; any order is valid JSON).
type CallParams struct {
	Method    string          `json:"method"`
	TimeoutMS int64           `json:"timeout_ms"`
	Args      json.RawMessage `json:"args,omitempty"`
}

// CancelParams name the call to give up.
type CancelParams struct {
	ID int64 `json:"id"`
}

// Response is a plugin's answer to one request.
type Response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      int64           `json:"id"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *RPCError       `json:"error,omitempty"`
}

// NoMessage stands for the message of an error a plugin gave none for.
const NoMessage = "failed, with no message"

// RPCError is a failed call: Data, if any, is what the method produced
// before it failed (a command's output), handed to the caller with the
// error.
type RPCError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// EncodeRequest is req as one line.
func EncodeRequest(req Request) []byte {
	if p, ok := req.Params.(CallParams); ok && req.ID != nil && req.Method == MethodCall {
		return appendCall(make([]byte, 0, 96+len(p.Method)+len(p.Args)), *req.ID, p)
	}
	req.JSONRPC = "2.0"
	b, err := json.Marshal(req)
	if err != nil { // the params are this package's own types
		panic(err)
	}
	return append(b, '\n')
}

// appendCall appends a call's line as json.Marshal writes it, without
// its reflection: a call is the message the agent sends most, and
// encoding it with Marshal cost as much CPU as the pipe's write.
func appendCall(b []byte, id int64, p CallParams) []byte {
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `,"method":"`+MethodCall+`","params":{"method":`...)
	b = appendString(b, p.Method)
	b = append(b, `,"timeout_ms":`...)
	b = strconv.AppendInt(b, p.TimeoutMS, 10)
	if len(p.Args) > 0 {
		b = append(b, `,"args":`...)
		// Compact checks the arguments and takes any line break out, and
		// HTMLEscape escapes <, >, &, U+2028 and U+2029 in their strings,
		// as Marshal does with a json.RawMessage: the same bytes, so that
		// a plugin that splits lines on U+2028 too still sees one line.
		var buf bytes.Buffer
		if err := json.Compact(&buf, p.Args); err != nil {
			panic(fmt.Errorf("wire: call arguments: %w", err)) // the agent passes only JSON it decoded
		}
		if bytes.ContainsAny(buf.Bytes(), "<>&\u2028\u2029") {
			var esc bytes.Buffer
			json.HTMLEscape(&esc, buf.Bytes())
			buf = esc
		}
		b = append(b, buf.Bytes()...)
	}
	return append(b, "}}\n"...)
}

// callPrefix and callMid frame a call's line as appendCall writes it.
const callPrefix, callMid = `{"jsonrpc":"2.0","id":`, `,"method":"` + MethodCall + `","params":{"method":"`

// ParseCall reads a call's line in the form EncodeRequest writes it
// (params' method, timeout_ms, args, in that order, no spaces), checking
// only the arguments, which it returns as a copy. It reports false for
// anything else, which the plugin then decodes as any JSON: what it
// takes, json.Unmarshal would take the same way (the SDK's
// FuzzParseCallAgreesWithUnmarshal).
func ParseCall(line []byte) (id int64, p CallParams, ok bool) {
	rest, ok := bytes.CutPrefix(line, []byte(callPrefix))
	if !ok {
		return 0, CallParams{}, false
	}
	if id, rest, ok = cutNumber(rest); !ok {
		return 0, CallParams{}, false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(callMid)); !ok {
		return 0, CallParams{}, false
	}
	end := 0
	for end < len(rest) && rest[end] >= 0x20 && rest[end] < 0x7f && rest[end] != '"' && rest[end] != '\\' {
		end++
	}
	method := string(rest[:end])
	if rest, ok = bytes.CutPrefix(rest[end:], []byte(`","timeout_ms":`)); !ok {
		return 0, CallParams{}, false
	}
	timeout, rest, ok := cutNumber(rest)
	if !ok {
		return 0, CallParams{}, false
	}
	if rest, ok = bytes.CutSuffix(bytes.TrimRight(rest, jsonSpace), []byte("}}")); !ok {
		return 0, CallParams{}, false
	}
	p = CallParams{Method: method, TimeoutMS: timeout}
	if len(rest) == 0 {
		return id, p, true
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`,"args":`)); !ok {
		return 0, CallParams{}, false
	}
	args := bytes.Trim(rest, jsonSpace)
	if len(args) == 0 || args[0] == 'n' || !json.Valid(args) { // null: Unmarshal's say
		return 0, CallParams{}, false
	}
	p.Args = bytes.Clone(args)
	return id, p, true
}

// appendString appends s as a JSON string: as it is when it has nothing
// to escape (a method name never has), else as Marshal writes it.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	return append(append(append(b, '"'), s...), '"')
}

// DecodeResponse parses one line from a plugin, strictly: JSON-RPC 2.0, an
// id, and exactly one of result and error.
func DecodeResponse(line []byte) (Response, error) {
	if r, ok := decodeResult(line); ok {
		return r, nil
	}
	return decodeStrict(line)
}

// decodeStrict is DecodeResponse for any line.
func decodeStrict(line []byte) (Response, error) {
	var r Response
	if err := strictjson.Decode(line, &r); errors.Is(err, strictjson.ErrTrailing) {
		return Response{}, fmt.Errorf("%w: more than one JSON value on a line (%q)", ErrProtocol, head(line))
	} else if err != nil {
		return Response{}, fmt.Errorf("%w: not a JSON-RPC response: %v (%q)", ErrProtocol, err, head(line))
	}
	switch {
	case r.JSONRPC != "2.0":
		return Response{}, fmt.Errorf("%w: jsonrpc %q, want \"2.0\"", ErrProtocol, r.JSONRPC)
	case r.ID < 0:
		return Response{}, fmt.Errorf("%w: id %d", ErrProtocol, r.ID)
	case (r.Error == nil) == (len(r.Result) == 0):
		return Response{}, fmt.Errorf("%w: response %d has both or neither of result and error", ErrProtocol, r.ID)
	}
	if r.Error != nil && r.Error.Message == "" {
		// JSON-RPC allows it (an exception raised with no text): the
		// call fails all the same, saying so.
		r.Error.Message = NoMessage
	}
	return r, nil
}

// resultPrefix and resultMid frame a result as the SDK writes it.
const resultPrefix, resultMid = `{"jsonrpc":"2.0","id":`, `,"result":`

// decodeResult takes the answer plugins write most, a result in the
// SDK's order ({"jsonrpc":"2.0","id":N,"result":R}), checking only R: the
// strict decoder's reflection cost more than the rest of reading the
// answer. It reports false for anything else (another order, spaces, an
// error, a result that is not one JSON value), which DecodeResponse then
// decodes strictly; what it takes, that decoder would take the same way
// (FuzzDecodeResultAgreesWithStrict).
func decodeResult(line []byte) (Response, bool) {
	rest, ok := bytes.CutPrefix(line, []byte(resultPrefix))
	if !ok {
		return Response{}, false
	}
	id, rest, ok := cutNumber(rest)
	if !ok {
		return Response{}, false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(resultMid)); !ok {
		return Response{}, false
	}
	if rest, ok = bytes.CutSuffix(bytes.TrimRight(rest, jsonSpace), []byte("}")); !ok {
		return Response{}, false
	}
	res := bytes.Trim(rest, jsonSpace)
	if len(res) == 0 || res[0] == 'n' || !json.Valid(res) { // null: the strict decoder's say
		return Response{}, false
	}
	return Response{JSONRPC: "2.0", ID: id, Result: bytes.Clone(res)}, true
}

// jsonSpace is what JSON allows between tokens.
const jsonSpace = " \t\r\n"

// cutNumber takes a non-negative integer (an id, a timeout) of at most
// 18 digits (so it fits in an int64) from the start of b, as JSON writes
// a number: no leading zero.
func cutNumber(b []byte) (int64, []byte, bool) {
	i := 0
	for i < len(b) && i < 19 && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	if i == 0 || i > 18 || (b[0] == '0' && i > 1) {
		return 0, b, false
	}
	id, err := strconv.ParseInt(string(b[:i]), 10, 64)
	return id, b[i:], err == nil
}

var kinds = []string{"collector", "processor", "publisher", "action"}

// ValidName reports whether s may name a plugin (and its file).
func ValidName(s string) bool { return names.Valid(s) }

// DecodeInfo checks a handshake answer: the protocol this agent speaks,
// the name the plugin's file has, a version, a known kind and at least
// one method, each a valid name.
func DecodeInfo(result json.RawMessage, file string) (Info, error) {
	var in Info
	d := json.NewDecoder(bytes.NewReader(result))
	d.DisallowUnknownFields()
	if err := d.Decode(&in); err != nil {
		return Info{}, fmt.Errorf("%w: handshake answer: %v", ErrProtocol, err)
	}
	switch {
	case in.Protocol != Protocol:
		return Info{}, fmt.Errorf("%w: the plugin speaks protocol %d, this agent %d", ErrProtocol, in.Protocol, Protocol)
	case in.Name != file:
		return Info{}, fmt.Errorf("%w: the plugin says it is %q, its file is %q: a plugin is named after its file", ErrProtocol, in.Name, file)
	case in.Version == "" || len(in.Version) > 64:
		return Info{}, fmt.Errorf("%w: version %q: want 1 to 64 bytes", ErrProtocol, in.Version)
	case !slices.Contains(kinds, in.Kind):
		return Info{}, fmt.Errorf("%w: kind %q: want one of %v", ErrProtocol, in.Kind, kinds)
	case len(in.Methods) == 0 || len(in.Methods) > 256:
		return Info{}, fmt.Errorf("%w: %d methods: want 1 to 256", ErrProtocol, len(in.Methods))
	}
	for _, m := range in.Methods {
		if !names.ValidMethod(m) {
			return Info{}, fmt.Errorf("%w: method name %q", ErrProtocol, m)
		}
	}
	return in, nil
}

// head is the start of b, for an error message.
func head(b []byte) []byte {
	if len(b) > 80 {
		return b[:80]
	}
	return bytes.TrimRight(b, "\n")
}
