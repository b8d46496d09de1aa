// Package api is the agent's local control API: HTTP/JSON over a Unix socket
// at <data-dir>/tribe.sock (mode 0600), served by the agent and used by the
// CLI through the typed Client.
//
// The transport (socket, HTTP framing, error envelope) lives in server.go and
// client.go and does not change when a capability is added: a new endpoint is
// a method on Agent, a row in routes, and a method on Client.
package api

import (
	"context"
	"time"
)

// SocketName is the socket's file name inside the data dir.
const SocketName = "tribe.sock"

// Agent is what the API serves. The node implements it. Methods are called
// concurrently from HTTP handlers, so they must be safe for concurrent use;
// they should return promptly and honour ctx.
type Agent interface {
	Status(ctx context.Context) (Status, error)
	Peers(ctx context.Context) ([]Peer, error)
}

// Status describes the local agent.
type Status struct {
	ID       string        `json:"id"`
	Name     string        `json:"name"`
	Cluster  string        `json:"cluster"`
	Version  string        `json:"version"`
	Addrs    []string      `json:"addrs"`
	Peers    int           `json:"peers"`
	MDNS     bool          `json:"mdns"`
	Private  bool          `json:"private"` // a swarm key is in use
	DataDir  string        `json:"data_dir"`
	Uptime   time.Duration `json:"uptime_ns"`
	Started  time.Time     `json:"started"`
	JoinAddr []string      `json:"join_addrs,omitempty"` // configured --join peers
}

// Peer is one connected tribe peer of the same cluster.
type Peer struct {
	ID    string   `json:"id"`
	Name  string   `json:"name"`
	Addrs []string `json:"addrs"`
}

// errorBody is the JSON envelope of every non-2xx response.
type errorBody struct {
	Error string `json:"error"`
}
