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
	"encoding/json"
	"time"

	"github.com/tribeagent/tribe/node/api/events"
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
	// NodesWithFacts is Nodes with each node's facts.
	NodesWithFacts(ctx context.Context, where string) ([]Node, error)
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
	Plugins(ctx context.Context, tribe string) ([]Plugin, error)
	LoadPlugin(ctx context.Context, name, tribe string, req LoadRequest) (Plugin, error)
	UnloadPlugin(ctx context.Context, name, tribe string) (Plugin, error)
	// Call runs a call on every target and hands each node's result to
	// emit as it arrives (emit is called from one goroutine at a time). An
	// error before any result means nothing was called.
	Call(ctx context.Context, req CallRequest, emit func(CallResult)) (CallSummary, error)
	// Admit admits nodes (names or peer IDs), or every pending node with
	// AllPending, or one node by peer ID under Name; Revoke revokes nodes.
	// Trusted writers only.
	Admit(ctx context.Context, req AdmitRequest) ([]Admission, error)
	Revoke(ctx context.Context, nodes []string) ([]Admission, error)
	// Watch calls emit with nil once it has subscribed, then with every
	// event under prefix (all with "") as it happens, from one goroutine,
	// until ctx ends (it returns nil then) or the agent shuts down (an
	// error). See package events.
	Watch(ctx context.Context, prefix string, emit func(*events.Event)) error
	// LeaveCluster makes this agent leave the cluster cleanly (its peers
	// see it `left`) and then stop. ForceLeave (trusted writers only)
	// makes every node treat nodes as left and reaped until they write a
	// newer record.
	LeaveCluster(ctx context.Context) (LeaveResult, error)
	ForceLeave(ctx context.Context, nodes []string) ([]Node, error)
	// Reload reads the agent's configuration again and applies what can
	// change live (tribe reload, SIGHUP).
	Reload(ctx context.Context) (ReloadResult, error)

	// Tasks: CreateTask (trusted writers) checks a manifest and writes it
	// for a tribe; Tasks lists them (of one tribe, if set); Task shows one
	// with its members' reports; SetTaskStopped stops or starts it
	// everywhere; DeleteTask removes it. A task is named uniquely across
	// tribes.
	CreateTask(ctx context.Context, tribe string, req TaskRequest) (Task, error)
	Tasks(ctx context.Context, tribe string) ([]Task, error)
	Task(ctx context.Context, name string) (Task, error)
	SetTaskStopped(ctx context.Context, name string, stopped bool) (Task, error)
	DeleteTask(ctx context.Context, name string) (Task, error)
	// WatchTask streams each run of a task on every member as it ends,
	// until ctx ends (emit(nil) once it watches).
	WatchTask(ctx context.Context, name string, emit func(*TaskRun)) error

	// Durable jobs: SubmitJob (trusted writers) fixes the targets and
	// writes the job; Job shows it with a row per target; Jobs lists them
	// (of one tribe, if set); CancelJob stops it on every target that has
	// not started it; JobOutput fetches a target's whole output; WaitJob
	// calls emit(nil) once it follows the job, then emits each target's
	// final state as it arrives, and returns when no target is pending.
	SubmitJob(ctx context.Context, req JobRequest) (Job, error)
	Job(ctx context.Context, id string) (Job, error)
	Jobs(ctx context.Context, tribe string) ([]Job, error)
	CancelJob(ctx context.Context, id string) (Job, error)
	JobOutput(ctx context.Context, id, node string) (JobOutput, error)
	WaitJob(ctx context.Context, id string, emit func(*JobTarget)) error
}

// ReloadResult is `tribe reload`: the settings read again and applied
// (config file keys; "fact" for --fact), those that differ but keep their
// running value until the agent restarts, and whether the facts changed.
type ReloadResult struct {
	Changed       []string `json:"changed"`
	RestartNeeded []string `json:"restart_needed"`
	FactsChanged  bool     `json:"facts_changed"`
}

// LeaveResult is `tribe leave`: how many peers acknowledged this agent's
// farewell, and why none did, if none did (it still spreads by gossip).
type LeaveResult struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	Acked int    `json:"acked"`
	Error string `json:"error,omitempty"`
}

// Admission is how a node stands with the trust list after `tribe admit`
// or `tribe revoke`: "admitted", "revoked", "pending" or "trusted", and
// why it was not changed, if it was not.
type Admission struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Admission string `json:"admission"`
	Error     string `json:"error,omitempty"`
}

// AdmitRequest is `tribe admit`.
type AdmitRequest struct {
	Nodes      []string `json:"nodes"`
	AllPending bool     `json:"all_pending"`
	// Name admits the one node of Nodes, a peer ID, under this name,
	// whether or not its record has reached the agent.
	Name string `json:"name,omitempty"`
}

// Plugin is a plugin loaded in a tribe and how its loading went on each
// member.
type Plugin struct {
	Name   string            `json:"name"`
	Tribe  string            `json:"tribe"`
	Config map[string]string `json:"config"`
	// Callers is who besides trusted writers may call it: "members" (of
	// Tribe), "tribe:NAME", "admitted" (every admitted node).
	Callers []string     `json:"callers"`
	Nodes   []PluginNode `json:"nodes"`
}

// PluginNode is one member's view of a plugin: "loaded", "error" (with
// the reason in Error), or "pending" (it has not said yet).
type PluginNode struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	State   string `json:"state"`
	Version string `json:"version,omitempty"`
	Error   string `json:"error,omitempty"`
	// Source is where the member's copy came from: builtin, local (its
	// plugin dir).
	Source string `json:"source,omitempty"`
}

// LoadRequest is `tribe plugin load`: the plugin's config and who besides
// trusted writers may call it (see Plugin.Callers).
type LoadRequest struct {
	Config  map[string]string `json:"config"`
	Callers []string          `json:"callers,omitempty"`
	// File, for `plugin add`, is the absolute path of an external
	// plugin's executable on the agent's host, to share with the tribe's
	// members that take shared plugins.
	File string `json:"file,omitempty"`
}

// CallRequest is `tribe call`: the targets are every member of each
// tribe plus each named node.
type CallRequest struct {
	Tribes  []string        `json:"tribes"`
	Nodes   []string        `json:"nodes"`
	Plugin  string          `json:"plugin"`
	Method  string          `json:"method"`
	Args    json.RawMessage `json:"args,omitempty"`
	Timeout time.Duration   `json:"timeout"` // for the whole call; 0 for the default
}

// CallResult is one node's answer to a call.
type CallResult struct {
	ID     string          `json:"id"`
	Name   string          `json:"name"`
	Tribe  string          `json:"tribe,omitempty"` // the tribe the call was made in
	OK     bool            `json:"ok"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
	Code   string          `json:"code,omitempty"` // why it failed: timeout, gone, unauthorized, ...
	MS     float64         `json:"ms"`             // from sending to the answer, as the caller saw it
}

// CallSummary counts how a call went: every target is in exactly one of
// Answered (ok), Failed, or TimedOut.
type CallSummary struct {
	Targets  int     `json:"targets"`
	Answered int     `json:"answered"`
	Failed   int     `json:"failed"`
	TimedOut int     `json:"timed_out"`
	MS       float64 `json:"ms"`
}

// callLine is one line of the streamed answer to POST /v1/call: a node's
// result, then the summary last, or an error if the agent failed midway.
type callLine struct {
	Node    *CallResult  `json:"node,omitempty"`
	Summary *CallSummary `json:"summary,omitempty"`
	Error   string       `json:"error,omitempty"`
}

// Policy puts the nodes whose facts match Expr (CEL over `facts`) in Tribe.
type Policy struct {
	Name  string `json:"name"`
	Tribe string `json:"tribe"`
	Expr  string `json:"expr"`
	// Error says why this node cannot use the policy (an entry it cannot
	// read, an expression that does not compile here): it matches
	// nothing here.
	Error string `json:"error,omitempty"`
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
	// Admission is how this node stands: "open", "trusted", "admitted",
	// "pending" or "revoked"; Pending counts the nodes waiting for
	// `tribe admit`.
	Admission string `json:"admission"`
	Pending   int    `json:"pending"`
	// Entries is the number of state keys held (tombstones included) and
	// StateHash a hash of them all: equal on nodes that agree.
	Entries   int    `json:"entries"`
	StateHash string `json:"state_hash"`
	// Rejected counts refused input by reason.
	Rejected map[string]int64 `json:"rejected"`
	// Dropped counts the message copies pubsub dropped under load, by
	// queue (outbound_queue, validation_queue, subscriber): usually
	// delivered by another path or repaired by anti-entropy; a growing
	// count means an overloaded node.
	Dropped map[string]int64 `json:"dropped"`
	// Joins is how each --join address fares, in the order given.
	Joins []Join `json:"joins,omitempty"`

	// MetricsAddr is where Prometheus metrics (/metrics) and the health
	// check (/healthz) are served, with the port picked; empty when off.
	MetricsAddr string `json:"metrics_addr,omitempty"`
}

// Node is one node of the fleet, from its replicated record.
type Node struct {
	ID      string   `json:"id"`
	Name    string   `json:"name"`
	Addrs   []string `json:"addrs"`
	Version string   `json:"version"`
	// Alive is true while the failure detector holds the node alive;
	// Liveness says "alive", "suspect" (it failed a probe and has not
	// refuted it yet), "dead" (suspected past the suspicion timeout), or
	// "left" (it left cleanly, or was force-left). Nodes dead or left for
	// longer than the reconnect timeout, and force-left ones, are not
	// listed.
	Alive    bool   `json:"alive"`
	Liveness string `json:"liveness"`
	Self     bool   `json:"self,omitempty"`
	// Admission is "open" (no trusted writers), "trusted", "admitted",
	// "pending" (its entries count for nothing until `tribe admit`) or
	// "revoked".
	Admission string `json:"admission"`
	// Facts are the node's replicated facts, from NodesWithFacts only.
	Facts map[string]any `json:"facts,omitempty"`
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

// streamLine is one line of a streamed answer (GET /v1/watch, GET /v1/tasks/NAME/watch): an item,
// or an error if the stream ends for another reason than the client
// leaving (the agent shutting down).
type streamLine[T any] struct {
	Event *T     `json:"event,omitempty"`
	Error string `json:"error,omitempty"`
	// End says the stream is complete (a job wait that saw every target
	// end), as opposed to cut short.
	End bool `json:"end,omitempty"`
}

// TaskRequest creates a task: its manifest as the user wrote it (YAML or
// JSON).
type TaskRequest struct {
	Manifest string `json:"manifest"`
}

// Task is a task of a tribe (plugins/tasks.Manifest) and, for `tribe task
// show`, how it goes on each member, from the members' own records.
type Task struct {
	Name     string          `json:"name"`
	Tribe    string          `json:"tribe"`
	Schedule json.RawMessage `json:"schedule"`
	Workflow json.RawMessage `json:"workflow"`
	Stopped  bool            `json:"stopped"`
	Created  time.Time       `json:"created"`
	Members  []TaskMember    `json:"members"`
}

// TaskMember is one member's report of a task. State is running, stopped,
// disabled, done or error; "pending" when the member has not reported it.
type TaskMember struct {
	ID       string    `json:"id"`
	Name     string    `json:"name"`
	State    string    `json:"state"`
	Runs     int       `json:"runs"`
	Failures int       `json:"failures"`
	LastRun  time.Time `json:"last_run,omitzero"`
	LastMS   int64     `json:"last_ms"`
	Error    string    `json:"error,omitempty"`
}

// TaskRun is one run of a task on one member, as `tribe task watch` shows
// it: its outcome and the head of its output (at most 1 KiB).
type TaskRun struct {
	Time   time.Time       `json:"time"`
	Task   string          `json:"task"`
	Tribe  string          `json:"tribe"`
	ID     string          `json:"id"`
	Name   string          `json:"name"`
	Run    int             `json:"run"`
	OK     bool            `json:"ok"`
	MS     int64           `json:"ms"`
	Error  string          `json:"error,omitempty"`
	Output json.RawMessage `json:"output,omitempty"` // JSON, or a JSON string of the head when cut
}

// JobRequest submits a durable job: a plugin call every target runs once,
// even a target that is down now, when it comes back before Expires.
type JobRequest struct {
	Tribes []string        `json:"tribes,omitempty"` // their members now are targets; the first is the job's queue
	Nodes  []string        `json:"nodes,omitempty"`  // names or peer IDs
	Plugin string          `json:"plugin"`
	Method string          `json:"method"`
	Args   json.RawMessage `json:"args,omitempty"`
	// Expires is how long after submission a target may still start it
	// (0: 24h, at most 30 days).
	Expires time.Duration `json:"expires,omitempty"`
	// Retries is how many more attempts a target makes after a failed or
	// interrupted one (0 to 10).
	Retries int `json:"retries,omitempty"`
	// IncludeNew also targets nodes that join one of Tribes before the job
	// expires.
	IncludeNew bool `json:"include_new,omitempty"`
	// Parallel runs it beside the tribe's queue instead of in its turn.
	Parallel bool `json:"parallel,omitempty"`
	// Timeout bounds one attempt (0: the call default, 30s; at most 10m).
	Timeout time.Duration `json:"timeout,omitempty"`
}

// Job is a durable job and where it stands. State is pending while any
// target may still run it, else done (every target done) or failed.
type Job struct {
	ID         string          `json:"id"`
	State      string          `json:"state"`
	Tribes     []string        `json:"tribes,omitempty"`
	Plugin     string          `json:"plugin"`
	Method     string          `json:"method"`
	Args       json.RawMessage `json:"args,omitempty"`
	Created    time.Time       `json:"created"`
	Expires    time.Time       `json:"expires"`
	Retries    int             `json:"retries"`
	IncludeNew bool            `json:"include_new,omitempty"`
	Parallel   bool            `json:"parallel,omitempty"`
	Cancelled  bool            `json:"cancelled,omitempty"`
	// Counts are the targets by state.
	Counts map[string]int `json:"counts"`
	// StateBytes is what the job holds of the replicated state: its
	// entry and the acks, signed, as every node stores them.
	StateBytes int         `json:"state_bytes"`
	Targets    []JobTarget `json:"targets,omitempty"`
	// Behind says why this node may know less of the job than its
	// writer, which holds the targets' acks (empty when it asked it, or
	// every target is final here): a target shown pending may have run.
	Behind string `json:"behind,omitempty"`
}

// JobTarget is where a job stands on one target, from the ack that target
// wrote (pending if it wrote none yet). MS is the last attempt's duration.
type JobTarget struct {
	Job          string `json:"job"`
	ID           string `json:"id"`
	Name         string `json:"name"`
	State        string `json:"state"`
	OK           bool   `json:"ok"`
	Attempts     int    `json:"attempts"`
	MS           int64  `json:"ms"`
	Error        string `json:"error,omitempty"`
	OutputHead   string `json:"output_head,omitempty"`
	OutputBytes  int    `json:"output_bytes,omitempty"`
	OutputDigest string `json:"output_digest,omitempty"`
}

// JobOutput is a target's whole output of a job (`tribe job output`), as
// the plugin answered it, checked against the digest in its ack.
type JobOutput struct {
	Job    string `json:"job"`
	ID     string `json:"id"`
	Name   string `json:"name"`
	Bytes  int    `json:"bytes"`
	Digest string `json:"digest"`
	Output string `json:"output"`
}
