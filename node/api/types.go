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
	Nodes(ctx context.Context, where string) ([]Node, error)
	Facts(ctx context.Context, node string) (map[string]any, error)
	Tribes(ctx context.Context) ([]TribeSummary, error)
	Tribe(ctx context.Context, name string) (Tribe, error)
	CreateTribe(ctx context.Context, name string) (Tribe, error)
	DeleteTribe(ctx context.Context, name string) (Tribe, error)
	Join(ctx context.Context, tribe string, nodes []string) ([]Member, error)
	Leave(ctx context.Context, tribe string, nodes []string) ([]Member, error)
	CreatePolicy(ctx context.Context, name, tribe, expr string) (Policy, error)
	Policies(ctx context.Context) ([]Policy, error)
	DeletePolicy(ctx context.Context, name string) (Policy, error)
	TestPolicy(ctx context.Context, expr string) ([]Match, error)
}

// Policy puts the nodes whose facts match Expr (CEL over `facts`) in Tribe.
type Policy struct {
	Name  string `json:"name"`
	Tribe string `json:"tribe"`
	Expr  string `json:"expr"`
}

// Match is one node's verdict in `tribe policy test`.
type Match struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	Match bool   `json:"match"`
	Error string `json:"error,omitempty"` // why it could not be evaluated there
}

// ExprRequest carries a CEL expression.
type ExprRequest struct {
	Expr string `json:"expr"`
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
	// Trust: "open" (every peer that can connect may write tribe state)
	// or "list", with the trusted writers in Trusted.
	Trust   string   `json:"trust"`
	Trusted []string `json:"trusted,omitempty"`
	// Entries is the number of state keys held (tombstones included) and
	// StateHash a hash of them all: equal on nodes that agree.
	Entries   int    `json:"entries"`
	StateHash string `json:"state_hash"`
	// Rejected counts refused input by reason.
	Rejected map[string]int64 `json:"rejected"`
}

// Node is one node of the fleet, from its replicated record.
type Node struct {
	ID      string   `json:"id"`
	Name    string   `json:"name"`
	Addrs   []string `json:"addrs"`
	Version string   `json:"version"`
	// Alive is true while the node is connected to this one or was heard
	// from (presence) within the presence timeout; Liveness says "alive",
	// "suspect" (silent up to twice the timeout) or "dead".
	Alive    bool   `json:"alive"`
	Liveness string `json:"liveness"`
	Self     bool   `json:"self,omitempty"`
}

// Member is a node in a tribe and why: "manual", or policy names.
type Member struct {
	ID    string   `json:"id"`
	Name  string   `json:"name"`
	Alive bool     `json:"alive"`
	Via   []string `json:"via"`
}

// TribeSummary is one line of `tribe list`.
type TribeSummary struct {
	Name    string `json:"name"`
	Members int    `json:"members"`
}

// Tribe is a tribe in full.
type Tribe struct {
	Name     string   `json:"name"`
	Explicit bool     `json:"explicit"` // has metadata (created, not only implied)
	Members  []Member `json:"members"`
	Policies []string `json:"policies"`
	Plugins  []string `json:"plugins"`
}

// NodesRequest names nodes by name or peer ID.
type NodesRequest struct {
	Nodes []string `json:"nodes"`
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
