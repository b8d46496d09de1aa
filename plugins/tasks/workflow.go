package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Caller makes one step's plugin call with its input: the local plugin
// registry, or for a publish step naming a Tribe, a remote call to one
// member of that tribe. The node provides it.
type Caller interface {
	Call(ctx context.Context, step Step, input json.RawMessage) (json.RawMessage, error)
}

// StepError is a run that failed: which step, and why.
type StepError struct {
	Step string // "collect", "process 2", "publish 1"
	Err  error
}

func (e *StepError) Error() string { return e.Step + ": " + e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

// Run runs the workflow once: collect with its args; each process step
// with the previous output; then every publish step with the last output
// (all of them, even when one fails: each is a separate destination). The
// output is what the last process step (or collect) made, which is what
// was published. The first step that fails stops what depends on it.
func (w Workflow) Run(ctx context.Context, c Caller) (json.RawMessage, error) {
	out, err := c.Call(ctx, w.Collect, w.Collect.Args)
	if err != nil {
		return nil, &StepError{"collect", err}
	}
	for i, s := range w.Process {
		if out, err = c.Call(ctx, s, stepInput(s, out)); err != nil {
			return nil, &StepError{fmt.Sprintf("process %d", i+1), err}
		}
	}
	var errs []error
	for i, s := range w.Publish {
		if _, err := c.Call(ctx, s, stepInput(s, out)); err != nil {
			errs = append(errs, &StepError{fmt.Sprintf("publish %d", i+1), err})
		}
	}
	return out, errors.Join(errs...)
}

// stepInput is what a process or publish step is called with: the
// previous output, or {"input": output, "args": args} when the step has
// args of its own.
func stepInput(s Step, prev json.RawMessage) json.RawMessage {
	if len(s.Args) == 0 {
		return prev
	}
	if len(prev) == 0 {
		prev = json.RawMessage("null")
	}
	b, _ := json.Marshal(struct {
		Input json.RawMessage `json:"input"`
		Args  json.RawMessage `json:"args"`
	}{prev, s.Args})
	return b
}

// Member states of a task.
const (
	Running  = "running"  // scheduled on this member
	Stopped  = "stopped"  // a trusted writer stopped it (tribe task stop)
	Disabled = "disabled" // too many failures in a row on this member
	Done     = "done"     // its schedule has no more runs (count, stop)
)

// Status is one member's record of a task: small (it goes in the member's
// node record), counters and the last error, never data.
type Status struct {
	State    string    `json:"state"`
	Runs     int       `json:"runs"`
	Failures int       `json:"failures"` // in a row
	LastRun  time.Time `json:"last_run,omitzero"`
	LastMS   int64     `json:"last_ms"`
	Error    string    `json:"error,omitempty"`
	// Task and Entry say which task entry the status is of, for a node
	// that takes its statuses up again as it starts: the task's creation
	// time (a task deleted and made again under its name is another
	// task) and a short hash of the entry (a disabled task runs again
	// only under a new entry).
	Task  time.Time `json:"task,omitzero"`
	Entry string    `json:"entry,omitempty"`
}

// maxErrorLen bounds the error kept in a status.
const maxErrorLen = 256

// Record takes a run's outcome: a run that ended at `at` after `took`, and
// its error. maxFailures failures in a row disable the task on this
// member, saying why.
func (st *Status) Record(at time.Time, took time.Duration, err error, maxFailures int) {
	st.Runs++
	st.LastRun, st.LastMS = at, took.Milliseconds()
	if err == nil {
		st.Failures, st.Error = 0, ""
		return
	}
	st.Failures++
	st.Error = err.Error()
	if len(st.Error) > maxErrorLen {
		st.Error = st.Error[:maxErrorLen] + "…"
	}
	if maxFailures <= 0 {
		maxFailures = DefaultMaxFailures
	}
	if st.Failures >= maxFailures {
		st.State = Disabled
		st.Error = fmt.Sprintf("disabled after %d failures in a row; last: %s", st.Failures, st.Error)
	}
}
