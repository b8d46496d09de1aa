package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"syscall"

	"github.com/tribeagent/tribe/node/api/events"
)

// ErrNoAgent is returned when nothing listens on the socket.
var ErrNoAgent = errors.New("api: no agent running")

// Client talks to an agent's socket. It is safe for concurrent use.
type Client struct {
	path string
	http *http.Client
}

// NewClient returns a client for the agent socket at path. It does not
// connect until the first call.
func NewClient(path string) *Client {
	return &Client{
		path: path,
		http: &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", path)
			},
		}},
	}
}

// Status returns the agent's status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	err := c.do(ctx, http.MethodGet, "/v1/status", nil, &s)
	return s, err
}

// Peers returns the agent's connected tribe peers.
func (c *Client) Peers(ctx context.Context) ([]Peer, error) {
	var p []Peer
	err := c.do(ctx, http.MethodGet, "/v1/peers", nil, &p)
	return p, err
}

// Nodes returns the fleet's nodes from the replicated state, filtered by
// a CEL expression over their facts when where is not empty.
func (c *Client) Nodes(ctx context.Context, where string) ([]Node, error) {
	var n []Node
	err := c.do(ctx, http.MethodGet, "/v1/nodes?where="+url.QueryEscape(where), nil, &n)
	return n, err
}

// NodesWithFacts is Nodes with each node's facts.
func (c *Client) NodesWithFacts(ctx context.Context, where string) ([]Node, error) {
	var n []Node
	err := c.do(ctx, http.MethodGet, "/v1/nodes?facts=1&where="+url.QueryEscape(where), nil, &n)
	return n, err
}

// Facts returns a node's facts (the local node's when node is empty).
func (c *Client) Facts(ctx context.Context, node string) (map[string]any, error) {
	var f map[string]any
	err := c.do(ctx, http.MethodGet, "/v1/facts?node="+url.QueryEscape(node), nil, &f)
	return f, err
}

// CreatePolicy creates or replaces a policy.
func (c *Client) CreatePolicy(ctx context.Context, name, tribe, expr string) (Policy, error) {
	var p Policy
	err := c.do(ctx, http.MethodPut, "/v1/policies/"+url.PathEscape(name), Policy{Tribe: tribe, Expr: expr}, &p)
	return p, err
}

// Policies lists the policies.
func (c *Client) Policies(ctx context.Context) ([]Policy, error) {
	var p []Policy
	err := c.do(ctx, http.MethodGet, "/v1/policies", nil, &p)
	return p, err
}

// DeletePolicy deletes a policy.
func (c *Client) DeletePolicy(ctx context.Context, name string) (Policy, error) {
	var p Policy
	err := c.do(ctx, http.MethodDelete, "/v1/policies/"+url.PathEscape(name), nil, &p)
	return p, err
}

// TestPolicy evaluates expr on every node's facts.
func (c *Client) TestPolicy(ctx context.Context, expr string) ([]Match, error) {
	var m []Match
	err := c.do(ctx, http.MethodPost, "/v1/policies/test", ExprRequest{Expr: expr}, &m)
	return m, err
}

// Tribes lists the tribes.
func (c *Client) Tribes(ctx context.Context) ([]TribeSummary, error) {
	var t []TribeSummary
	err := c.do(ctx, http.MethodGet, "/v1/tribes", nil, &t)
	return t, err
}

// Tribe shows one tribe.
func (c *Client) Tribe(ctx context.Context, name string) (Tribe, error) {
	var t Tribe
	err := c.do(ctx, http.MethodGet, "/v1/tribes/"+url.PathEscape(name), nil, &t)
	return t, err
}

// CreateTribe creates a tribe; it returns once the entry is stored.
func (c *Client) CreateTribe(ctx context.Context, name string) (Tribe, error) {
	var t Tribe
	err := c.do(ctx, http.MethodPut, "/v1/tribes/"+url.PathEscape(name), nil, &t)
	return t, err
}

// DeleteTribe deletes a tribe and its manual memberships.
func (c *Client) DeleteTribe(ctx context.Context, name string) (Tribe, error) {
	var t Tribe
	err := c.do(ctx, http.MethodDelete, "/v1/tribes/"+url.PathEscape(name), nil, &t)
	return t, err
}

// Join adds nodes (names or peer IDs) to a tribe by hand.
func (c *Client) Join(ctx context.Context, tribe string, nodes []string) ([]Member, error) {
	var m []Member
	err := c.do(ctx, http.MethodPost, "/v1/tribes/"+url.PathEscape(tribe)+"/join", NodesRequest{Nodes: nodes}, &m)
	return m, err
}

// Leave removes nodes' manual membership of a tribe.
func (c *Client) Leave(ctx context.Context, tribe string, nodes []string) ([]Member, error) {
	var m []Member
	err := c.do(ctx, http.MethodPost, "/v1/tribes/"+url.PathEscape(tribe)+"/leave", NodesRequest{Nodes: nodes}, &m)
	return m, err
}

// Plugins lists the plugins loaded in tribes (in tribe only, if set) with
// each member's loading state.
func (c *Client) Plugins(ctx context.Context, tribe string) ([]Plugin, error) {
	var p []Plugin
	err := c.do(ctx, http.MethodGet, "/v1/plugins?tribe="+url.QueryEscape(tribe), nil, &p)
	return p, err
}

// LoadPlugin loads a plugin on every member of a tribe.
func (c *Client) LoadPlugin(ctx context.Context, name, tribe string, req LoadRequest) (Plugin, error) {
	var p Plugin
	err := c.do(ctx, http.MethodPut, "/v1/tribes/"+url.PathEscape(tribe)+"/plugins/"+url.PathEscape(name), req, &p)
	return p, err
}

// Admit admits nodes (names or peer IDs), or every pending node, or one
// node by peer ID under a name.
func (c *Client) Admit(ctx context.Context, req AdmitRequest) ([]Admission, error) {
	var a []Admission
	err := c.do(ctx, http.MethodPost, "/v1/admit", req, &a)
	return a, err
}

// Revoke revokes nodes' admission.
func (c *Client) Revoke(ctx context.Context, nodes []string) ([]Admission, error) {
	var a []Admission
	err := c.do(ctx, http.MethodPost, "/v1/revoke", NodesRequest{Nodes: nodes}, &a)
	return a, err
}

// LeaveCluster makes the agent leave the cluster cleanly and stop.
func (c *Client) LeaveCluster(ctx context.Context) (LeaveResult, error) {
	var res LeaveResult
	err := c.do(ctx, http.MethodPost, "/v1/leave", struct{}{}, &res)
	return res, err
}

// CreateTask writes a task for a tribe from its manifest (YAML or JSON).
func (c *Client) CreateTask(ctx context.Context, tribe, manifest string) (Task, error) {
	var t Task
	err := c.do(ctx, http.MethodPut, "/v1/tribes/"+url.PathEscape(tribe)+"/tasks", TaskRequest{Manifest: manifest}, &t)
	return t, err
}

// Tasks lists the tasks (of tribe only, if set).
func (c *Client) Tasks(ctx context.Context, tribe string) ([]Task, error) {
	var ts []Task
	err := c.do(ctx, http.MethodGet, "/v1/tasks?tribe="+url.QueryEscape(tribe), nil, &ts)
	return ts, err
}

// Task shows a task with its members' reports.
func (c *Client) Task(ctx context.Context, name string) (Task, error) {
	var t Task
	err := c.do(ctx, http.MethodGet, "/v1/tasks/"+url.PathEscape(name), nil, &t)
	return t, err
}

// SetTaskStopped stops (or starts again) a task on every member.
func (c *Client) SetTaskStopped(ctx context.Context, name string, stopped bool) (Task, error) {
	verb := "start"
	if stopped {
		verb = "stop"
	}
	var t Task
	err := c.do(ctx, http.MethodPost, "/v1/tasks/"+url.PathEscape(name)+"/"+verb, struct{}{}, &t)
	return t, err
}

// DeleteTask removes a task from its tribe.
func (c *Client) DeleteTask(ctx context.Context, name string) (Task, error) {
	var t Task
	err := c.do(ctx, http.MethodDelete, "/v1/tasks/"+url.PathEscape(name), nil, &t)
	return t, err
}

// Reload makes the agent read its configuration again and apply what can
// change live.
func (c *Client) Reload(ctx context.Context) (ReloadResult, error) {
	var res ReloadResult
	err := c.do(ctx, http.MethodPost, "/v1/reload", struct{}{}, &res)
	return res, err
}

// ForceLeave marks nodes (names or peer IDs) as left and reaped on every
// node until they write a newer record. Trusted writers only.
func (c *Client) ForceLeave(ctx context.Context, nodes []string) ([]Node, error) {
	var out []Node
	err := c.do(ctx, http.MethodPost, "/v1/force-leave", NodesRequest{Nodes: nodes}, &out)
	return out, err
}

// UnloadPlugin unloads a plugin from a tribe's members.
func (c *Client) UnloadPlugin(ctx context.Context, name, tribe string) (Plugin, error) {
	var p Plugin
	err := c.do(ctx, http.MethodDelete, "/v1/tribes/"+url.PathEscape(tribe)+"/plugins/"+url.PathEscape(name), nil, &p)
	return p, err
}

// Call runs a call through the agent and hands each node's result to
// emit as it arrives; it returns the summary once every target has
// answered, failed or timed out.
func (c *Client) Call(ctx context.Context, req CallRequest, emit func(CallResult)) (CallSummary, error) {
	resp, err := c.send(ctx, http.MethodPost, "/v1/call", req)
	if err != nil {
		return CallSummary{}, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var l callLine
		if err := dec.Decode(&l); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return CallSummary{}, fmt.Errorf("api: call: the agent's answer ended early: %w", err)
		}
		switch {
		case l.Node != nil:
			emit(*l.Node)
		case l.Summary != nil:
			return *l.Summary, nil
		default:
			return CallSummary{}, &Error{Status: http.StatusInternalServerError, Message: l.Error}
		}
	}
}

// Watch streams the agent's events under prefix (all with "") to emit as
// they happen. ready, if not nil, is called once the agent has subscribed:
// every event from then on reaches emit. It returns nil when ctx ends (the caller stopped watching)
// and an error if the agent ends the stream (it shut down) or cannot be
// reached.
func (c *Client) Watch(ctx context.Context, prefix string, ready func(), emit func(events.Event)) error {
	return readStream(c, ctx, "/v1/watch?prefix="+url.QueryEscape(prefix), ready, emit)
}

// WatchTask streams each run of a task on every member as it ends, until
// ctx ends; ready is called once the agent watches.
func (c *Client) WatchTask(ctx context.Context, name string, ready func(), emit func(TaskRun)) error {
	return readStream(c, ctx, "/v1/tasks/"+url.PathEscape(name)+"/watch", ready, emit)
}

// SubmitJob writes a durable job and returns it with its id.
func (c *Client) SubmitJob(ctx context.Context, req JobRequest) (Job, error) {
	var j Job
	err := c.do(ctx, http.MethodPost, "/v1/jobs", req, &j)
	return j, err
}

// Job shows a job with a row per target.
func (c *Client) Job(ctx context.Context, id string) (Job, error) {
	var j Job
	err := c.do(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(id), nil, &j)
	return j, err
}

// Jobs lists the jobs (of tribe only, if set), oldest first.
func (c *Client) Jobs(ctx context.Context, tribe string) ([]Job, error) {
	var js []Job
	err := c.do(ctx, http.MethodGet, "/v1/jobs?tribe="+url.QueryEscape(tribe), nil, &js)
	return js, err
}

// CancelJob cancels a job on every target that has not started it.
func (c *Client) CancelJob(ctx context.Context, id string) (Job, error) {
	var j Job
	err := c.do(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(id)+"/cancel", nil, &j)
	return j, err
}

// JobOutput fetches a target's whole output of a job.
func (c *Client) JobOutput(ctx context.Context, id, node string) (JobOutput, error) {
	var o JobOutput
	err := c.do(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(id)+"/output/"+url.PathEscape(node), nil, &o)
	return o, err
}

// WaitJob streams each target's final state of a job as it arrives and
// returns when no target is pending (nil), ctx ends (nil) or the agent
// ends the stream (an error); ready is called once the agent follows it.
func (c *Client) WaitJob(ctx context.Context, id string, ready func(), emit func(JobTarget)) error {
	return readStream(c, ctx, "/v1/jobs/"+url.PathEscape(id)+"/wait", ready, emit)
}

// readStream reads an NDJSON stream of streamHandler's lines.
func readStream[T any](c *Client, ctx context.Context, path string, ready func(), emit func(T)) error {
	resp, err := c.send(ctx, http.MethodGet, path, nil)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer resp.Body.Close()
	if ready != nil {
		ready()
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var l streamLine[T]
		if err := dec.Decode(&l); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("api: watch: the agent's stream ended: %w", err)
		}
		switch {
		case l.Event != nil:
			emit(*l.Event)
		case l.End:
			return nil
		default:
			return &Error{Status: http.StatusInternalServerError, Message: l.Error}
		}
	}
}

// do sends in (if not nil) as JSON and decodes the answer into out.
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	resp, err := c.send(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("api: decode answer to %s %s: %w", method, path, err)
	}
	return nil
}

// send sends in (if not nil) as JSON and returns a 2xx response; any
// other status comes back as an *Error.
func (c *Client) send(ctx context.Context, method, path string, in any) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("api: encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://tribe"+path, body)
	if err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w at %s (start one with `tribe agent`, or point --data-dir at its data dir)", ErrNoAgent, c.path)
		}
		return nil, fmt.Errorf("api: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		var e errorBody
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Error == "" {
			return nil, &Error{Status: resp.StatusCode, Message: fmt.Sprintf("agent answered %s", resp.Status)}
		}
		return nil, &Error{Status: resp.StatusCode, Message: e.Error}
	}
	return resp, nil
}
