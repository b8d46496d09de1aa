// Package tasks is the pure core of tribe's tasks (DESIGN.md, "Durable jobs
// and tasks"): a manifest, in the spirit of Intel snap's, names a schedule
// and a workflow of plugin calls (one collect step, then process steps,
// then publish steps, the output of each the input of the next), created
// for a tribe and run by every member. This package decodes and checks
// manifests and computes schedules; it does no I/O and reads no clock.
package tasks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/robfig/cron/v3"
	"go.yaml.in/yaml/v3"

	"github.com/tribeagent/tribe/internal/names"
)

// Limits of a manifest. It travels in a signed entry, so it must fit one
// (64 KiB) with room to spare.
const (
	MaxManifestSize = 32 << 10
	MaxSteps        = 16
	MinInterval     = time.Second
	// DefaultMaxFailures disables a task on a member after this many
	// failed runs in a row.
	DefaultMaxFailures = 10
)

// Manifest is a task: a name, a schedule and a workflow.
type Manifest struct {
	Name        string   `json:"name" yaml:"name"`
	Schedule    Schedule `json:"schedule" yaml:"schedule"`
	Workflow    Workflow `json:"workflow" yaml:"workflow"`
	MaxFailures int      `json:"max_failures,omitempty" yaml:"max_failures"`
}

// Schedule says when a task runs: every Interval, or at the times of a
// Cron expression (standard five fields, in UTC), from Start (if set) until
// Stop (if set), at most Count times (0: no limit), each run delayed on
// each member by a stable share of Splay so members do not fire together.
type Schedule struct {
	Interval Duration  `json:"interval,omitempty" yaml:"interval"`
	Cron     string    `json:"cron,omitempty" yaml:"cron"`
	Start    time.Time `json:"start,omitzero" yaml:"start"`
	Stop     time.Time `json:"stop,omitzero" yaml:"stop"`
	Count    int       `json:"count,omitempty" yaml:"count"`
	Splay    Duration  `json:"splay,omitempty" yaml:"splay"`
}

// Workflow is collect, then process steps, then publish steps.
type Workflow struct {
	Collect Step   `json:"collect" yaml:"collect"`
	Process []Step `json:"process,omitempty" yaml:"process"`
	Publish []Step `json:"publish,omitempty" yaml:"publish"`
}

// Step is one plugin call. Args are the call's arguments for collect; for
// process and publish steps the previous step's output is the input and
// Args, if set, are given alongside as {"input": ..., "args": ...}. A
// publish step with a Tribe sends its input to one member of that tribe
// instead of calling the plugin here (snap's remote publishing).
type Step struct {
	Plugin string          `json:"plugin" yaml:"plugin"`
	Method string          `json:"method" yaml:"method"`
	Args   json.RawMessage `json:"args,omitempty" yaml:"-"`
	Tribe  string          `json:"tribe,omitempty" yaml:"tribe"`
}

// UnmarshalYAML takes a step's args as any YAML value, kept as JSON.
func (s *Step) UnmarshalYAML(n *yaml.Node) error {
	var raw struct {
		Plugin string `yaml:"plugin"`
		Method string `yaml:"method"`
		Tribe  string `yaml:"tribe"`
		Args   any    `yaml:"args"`
	}
	if err := n.Decode(&raw); err != nil {
		return err
	}
	s.Plugin, s.Method, s.Tribe = raw.Plugin, raw.Method, raw.Tribe
	if raw.Args != nil {
		b, err := json.Marshal(raw.Args)
		if err != nil {
			return fmt.Errorf("args: %w", err)
		}
		s.Args = b
	}
	return nil
}

// Duration is a time.Duration written as Go writes it ("10s", "1m30s").
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration such as \"10s\": %w", err)
	}
	return d.parse(s)
}

func (d *Duration) UnmarshalYAML(n *yaml.Node) error { return d.parse(n.Value) }

func (d *Duration) parse(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: use a number and a unit, such as 10s or 5m", s)
	}
	*d = Duration(v)
	return nil
}

// ErrBadManifest wraps every reason a manifest is refused.
var ErrBadManifest = errors.New("tasks: bad manifest")

// Decode reads a manifest, YAML or JSON (JSON is YAML), refusing unknown
// fields, trailing documents and anything over MaxManifestSize, and checks
// it.
func Decode(b []byte) (Manifest, error) {
	var m Manifest
	if len(b) > MaxManifestSize {
		return m, fmt.Errorf("%w: %d bytes, over the %d-byte limit", ErrBadManifest, len(b), MaxManifestSize)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&m); err != nil {
		if errors.Is(err, io.EOF) {
			return m, fmt.Errorf("%w: empty", ErrBadManifest)
		}
		return m, fmt.Errorf("%w: %v", ErrBadManifest, err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return m, fmt.Errorf("%w: more than one document", ErrBadManifest)
	}
	// One form for one manifest: no empty lists or args, times in UTC.
	w := &m.Workflow
	if len(w.Process) == 0 {
		w.Process = nil
	}
	if len(w.Publish) == 0 {
		w.Publish = nil
	}
	m.Schedule.Start, m.Schedule.Stop = m.Schedule.Start.UTC(), m.Schedule.Stop.UTC()
	return m, m.Check()
}

// Check reports everything wrong with the manifest that it can tell alone
// (whether each plugin exists and is loaded in the tribe is the caller's
// to check).
func (m Manifest) Check() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !names.Valid(m.Name) {
		bad("name %q: use lower-case letters, digits, '.', '_' or '-', at most 63", m.Name)
	}
	if err := m.Schedule.Check(); err != nil {
		errs = append(errs, err)
	}
	if m.MaxFailures < 0 {
		bad("max_failures must not be negative, not %d", m.MaxFailures)
	}
	steps := m.Workflow.Steps()
	if len(steps) > MaxSteps {
		bad("%d steps, at most %d", len(steps), MaxSteps)
	}
	for i, s := range steps {
		kind := m.Workflow.kind(i)
		switch {
		case s.Plugin == "" || s.Method == "":
			bad("%s step %d: name a plugin and a method", kind, i+1)
		case s.Tribe != "" && kind != "publish":
			bad("%s step %d: only a publish step may send to another tribe", kind, i+1)
		}
		if len(s.Args) > 0 && !json.Valid(s.Args) {
			bad("%s step %d: args are not valid JSON", kind, i+1)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrBadManifest, err)
	}
	return nil
}

// Steps are the workflow's steps in the order they run.
func (w Workflow) Steps() []Step {
	return append(append([]Step{w.Collect}, w.Process...), w.Publish...)
}

// kind names the i-th step of Steps.
func (w Workflow) kind(i int) string {
	switch {
	case i == 0:
		return "collect"
	case i <= len(w.Process):
		return "process"
	}
	return "publish"
}

// Check reports what is wrong with the schedule.
func (s Schedule) Check() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch {
	case s.Interval == 0 && s.Cron == "":
		bad("schedule: give an interval (such as 10s) or a cron expression")
	case s.Interval != 0 && s.Cron != "":
		bad("schedule: give an interval or a cron expression, not both")
	case s.Interval != 0 && time.Duration(s.Interval) < MinInterval:
		bad("schedule: interval %v is under the %v minimum", time.Duration(s.Interval), MinInterval)
	case s.Cron != "":
		if _, err := parseCron(s.Cron); err != nil {
			bad("schedule: cron %q: %v", s.Cron, err)
		}
	}
	if s.Count < 0 {
		bad("schedule: count must not be negative, not %d", s.Count)
	}
	if s.Splay < 0 {
		bad("schedule: splay must not be negative")
	}
	for _, t := range []struct {
		name string
		at   time.Time
	}{{"start", s.Start}, {"stop", s.Stop}} {
		if !t.at.IsZero() && (t.at.Before(earliestTime) || t.at.After(latestTime)) {
			bad("schedule: %s %v is not between %d and %d", t.name, t.at, earliestTime.Year(), latestTime.Year())
		}
	}
	if !s.Start.IsZero() && !s.Stop.IsZero() && !s.Stop.After(s.Start) {
		bad("schedule: stop %v is not after start %v", s.Stop, s.Start)
	}
	return errors.Join(errs...)
}

// A schedule's start and stop lie in these years: the span from a start
// to now must fit a time.Duration (292 years), or an interval schedule's
// next run is computed wrong (a start in year 226 named a time in the
// past, and the task ran without a pause on every member).
var (
	earliestTime = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	latestTime   = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

// parseCron parses a standard five-field cron expression (and the
// @hourly, @daily ... descriptors), evaluated in UTC.
func parseCron(expr string) (cron.Schedule, error) {
	return cron.ParseStandard("TZ=UTC " + expr)
}
