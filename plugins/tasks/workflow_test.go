package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakes are plugins by name: each call is logged with its input.
type fakes struct {
	mu    sync.Mutex
	calls []string
	fail  map[string]bool
}

func (f *fakes) Call(_ context.Context, s Step, in json.RawMessage) (json.RawMessage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	name := s.Plugin + "." + s.Method
	if s.Tribe != "" {
		name += "@" + s.Tribe
	}
	f.calls = append(f.calls, name+" "+string(in))
	if f.fail[name] {
		return nil, errors.New(name + " failed")
	}
	switch s.Plugin {
	case "count": // collect: a number
		return json.RawMessage(`3`), nil
	case "double": // process: the number twice
		var n int
		json.Unmarshal(in, &n)
		b, _ := json.Marshal(2 * n)
		return b, nil
	}
	return json.RawMessage(`{}`), nil // publishers answer nothing of use
}

func TestWorkflowChainsProcessAndFansOutPublish(t *testing.T) {
	w := Workflow{
		Collect: Step{Plugin: "count", Method: "collect", Args: json.RawMessage(`{"n":1}`)},
		Process: []Step{{Plugin: "double", Method: "run"}, {Plugin: "double", Method: "run"}},
		Publish: []Step{{Plugin: "file", Method: "publish"}, {Plugin: "file", Method: "publish", Tribe: "sink", Args: json.RawMessage(`{"tag":"x"}`)}},
	}
	f := &fakes{}
	out, err := w.Run(context.Background(), f)
	if err != nil || string(out) != "12" {
		t.Fatalf("run: %s, %v", out, err)
	}
	want := []string{`count.collect {"n":1}`, "double.run 3", "double.run 6", "file.publish 12", `file.publish@sink {"input":12,"args":{"tag":"x"}}`}
	if strings.Join(f.calls, "\n") != strings.Join(want, "\n") {
		t.Errorf("calls:\n%s\nwant:\n%s", strings.Join(f.calls, "\n"), strings.Join(want, "\n"))
	}
}

func TestWorkflowFailingSteps(t *testing.T) {
	w := Workflow{
		Collect: Step{Plugin: "count", Method: "collect"},
		Process: []Step{{Plugin: "double", Method: "run"}},
		Publish: []Step{{Plugin: "a", Method: "p"}, {Plugin: "b", Method: "p"}},
	}
	f := &fakes{fail: map[string]bool{"double.run": true}}
	_, err := w.Run(context.Background(), f)
	var se *StepError
	if !errors.As(err, &se) || se.Step != "process 1" || len(f.calls) != 2 {
		t.Errorf("a failing process step: %v after %v", err, f.calls)
	}
	// A failing publisher does not keep the next one from its data.
	f = &fakes{fail: map[string]bool{"a.p": true}}
	_, err = w.Run(context.Background(), f)
	if err == nil || !strings.Contains(err.Error(), "publish 1: a.p failed") || len(f.calls) != 4 {
		t.Errorf("a failing publisher: %v after %v", err, f.calls)
	}
}

func TestStatusDisablesAfterMaxFailures(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	st := Status{State: Running}
	fail := errors.New("collect: sys.collect failed")
	st.Record(t0, 20*time.Millisecond, fail, 3)
	st.Record(t0, 20*time.Millisecond, fail, 3)
	if st.State != Running || st.Failures != 2 {
		t.Fatalf("after 2 failures: %+v", st)
	}
	st.Record(t0, 20*time.Millisecond, nil, 3)
	if st.Failures != 0 || st.Error != "" || st.Runs != 3 {
		t.Fatalf("a success resets the failures: %+v", st)
	}
	for range 3 {
		st.Record(t0.Add(time.Second), 5*time.Millisecond, fail, 3)
	}
	if st.State != Disabled || !strings.Contains(st.Error, "disabled after 3 failures in a row") || st.LastMS != 5 {
		t.Errorf("after 3 in a row with max_failures 3: %+v", st)
	}
	long := Status{State: Running}
	long.Record(t0, 0, errors.New(strings.Repeat("x", 10_000)), 0)
	if len(long.Error) > maxErrorLen+len("…") {
		t.Errorf("an error of %d bytes is kept in a status", len(long.Error))
	}
}
