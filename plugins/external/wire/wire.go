// Package wire is the protocol between the agent and an external plugin
// (package external runs them, package sdk writes them in Go): its
// messages, their encoding and their strict decoding. It does no I/O.
//
// The protocol, version 1. Each message is one JSON object on one line.
//
//	agent  {"jsonrpc":"2.0","id":0,"method":"tribe.handshake","params":{"protocol":1}}
//	plugin {"jsonrpc":"2.0","id":0,"result":{"protocol":1,"name":"hello","version":"1.0.0","kind":"processor","methods":["echo"]}}
//	agent  {"jsonrpc":"2.0","id":1,"method":"tribe.call","params":{"method":"echo","args":{"a":1},"timeout_ms":30000}}
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

	"github.com/tribeagent/tribe/internal/names"
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
type CallParams struct {
	Method    string          `json:"method"`
	Args      json.RawMessage `json:"args,omitempty"`
	TimeoutMS int64           `json:"timeout_ms"`
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
	req.JSONRPC = "2.0"
	b, err := json.Marshal(req)
	if err != nil { // the params are this package's own types
		panic(err)
	}
	return append(b, '\n')
}

// DecodeResponse parses one line from a plugin, strictly: JSON-RPC 2.0, an
// id, and exactly one of result and error.
func DecodeResponse(line []byte) (Response, error) {
	var r Response
	d := json.NewDecoder(bytes.NewReader(line))
	d.DisallowUnknownFields()
	if err := d.Decode(&r); err != nil {
		return Response{}, fmt.Errorf("%w: not a JSON-RPC response: %v (%q)", ErrProtocol, err, head(line))
	}
	if d.More() {
		return Response{}, fmt.Errorf("%w: more than one JSON value on a line (%q)", ErrProtocol, head(line))
	}
	switch {
	case r.JSONRPC != "2.0":
		return Response{}, fmt.Errorf("%w: jsonrpc %q, want \"2.0\"", ErrProtocol, r.JSONRPC)
	case r.ID < 0:
		return Response{}, fmt.Errorf("%w: id %d", ErrProtocol, r.ID)
	case (r.Error == nil) == (len(r.Result) == 0):
		return Response{}, fmt.Errorf("%w: response %d has both or neither of result and error", ErrProtocol, r.ID)
	case r.Error != nil && r.Error.Message == "":
		return Response{}, fmt.Errorf("%w: response %d: an error with no message", ErrProtocol, r.ID)
	}
	return r, nil
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
