package jobs

import (
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)

// job is a job of queue "web" targeting self, created at t0+seq seconds.
func job(id string, seq uint64, opts ...func(*Job)) *Job {
	j := &Job{ID: id, Tribes: []string{"web"}, Plugin: "exec", Method: "run", Seq: seq,
		Created: t0.Add(time.Duration(seq) * time.Second), Expires: t0.Add(time.Hour)}
	j.SetTargets([]string{"self", "other"})
	for _, o := range opts {
		o(j)
	}
	return j
}

func view(jobs []*Job, acks map[string]Ack, running ...string) View {
	r := map[string]bool{}
	for _, id := range running {
		r[id] = true
	}
	if acks == nil {
		acks = map[string]Ack{}
	}
	return View{Self: "self", Now: t0.Add(time.Minute), Jobs: jobs, Acks: acks, Running: r,
		Known: func(string) bool { return true }, Member: func(t string) bool { return t == "web" }}
}

func runIDs(p Plan) string {
	var ids []string
	for _, j := range p.Runs {
		ids = append(ids, j.ID)
	}
	return strings.Join(ids, ",")
}

func TestDecide(t *testing.T) {
	notMine := job("n", 1)
	notMine.SetTargets([]string{"other"})
	tests := []struct {
		name     string
		v        View
		runs     string
		acks     map[string]State // the acks the plan writes
		wakeSet  bool
		mutate   func(*View)
		wantErrs map[string]string // ack error contains
	}{
		{name: "nothing", v: view(nil, nil)},
		{name: "one job runs", v: view([]*Job{job("a", 1)}, nil), runs: "a", wakeSet: true},
		{name: "not a target", v: view([]*Job{notMine}, nil)},
		{name: "include-new member takes it", v: view([]*Job{func() *Job {
			j := job("a", 1, func(j *Job) { j.IncludeNew = true })
			j.SetTargets([]string{"other"})
			return j
		}()}, nil), runs: "a", wakeSet: true},
		{name: "queue runs in seq order, one at a time", v: view([]*Job{job("c", 3), job("a", 1), job("b", 2)}, nil), runs: "a", wakeSet: true},
		{name: "the next waits while one runs", v: view([]*Job{job("a", 1), job("b", 2)},
			map[string]Ack{"a": {State: Running, Attempts: 1}}, "a"), wakeSet: true},
		{name: "after a done one, the next", v: view([]*Job{job("a", 1), job("b", 2)},
			map[string]Ack{"a": {State: Done}}), runs: "b", wakeSet: true},
		{name: "parallel runs beside the queue", v: view([]*Job{job("a", 1), job("p", 2, func(j *Job) { j.Parallel = true })},
			map[string]Ack{"a": {State: Running, Attempts: 1}}, "a"), runs: "p", wakeSet: true},
		{name: "queues are separate", v: view([]*Job{job("a", 1), job("x", 1, func(j *Job) { j.Tribes = []string{"db"} })}, nil), runs: "a,x", wakeSet: true},
		{name: "a job waits for the job it follows", v: func() View {
			v := view([]*Job{job("b", 2, func(j *Job) { j.After = "a" }), job("c", 3)}, nil)
			v.Known = func(id string) bool { return id != "a" }
			return v
		}(), wakeSet: true},
		{name: "a queued job waits through a parallel one for the job before it", v: func() View {
			// c follows p (parallel), which follows b, not known yet: c must
			// not pass b, though p is known and may run beside the queue.
			v := view([]*Job{job("p", 2, func(j *Job) { j.Parallel, j.After = true, "b" }), job("c", 3, func(j *Job) { j.After = "p" })}, nil)
			v.Known = func(id string) bool { return id != "b" }
			return v
		}(), wakeSet: true},
		{name: "a queued job follows a parallel one whose own predecessor is here", v: view([]*Job{job("b", 1),
			job("p", 2, func(j *Job) { j.Parallel, j.After = true, "b" }), job("c", 3, func(j *Job) { j.After = "p" })},
			map[string]Ack{"b": {State: Done}}), runs: "p,c", wakeSet: true},
		{name: "parallel jobs in a circle hold the queue, not the loop", v: view([]*Job{
			job("p", 1, func(j *Job) { j.Parallel, j.After = true, "q" }), job("q", 2, func(j *Job) { j.Parallel, j.After = true, "p" }),
			job("c", 3, func(j *Job) { j.After = "q" })}, nil), runs: "p,q", wakeSet: true},
		{name: "crash with no retries left: interrupted", v: view([]*Job{job("a", 1), job("b", 2)},
			map[string]Ack{"a": {State: Running, Attempts: 1}}),
			runs: "b", acks: map[string]State{"a": Interrupted}, wakeSet: true, wantErrs: map[string]string{"a": "interrupted"}},
		{name: "crash with a retry left: retrying, and the queue waits", v: view([]*Job{job("a", 1, func(j *Job) { j.Retries = 1 }), job("b", 2)},
			map[string]Ack{"a": {State: Running, Attempts: 1}}),
			acks: map[string]State{"a": Retrying}, wakeSet: true},
		{name: "a due retry runs", v: view([]*Job{job("a", 1, func(j *Job) { j.Retries = 1 })},
			map[string]Ack{"a": {State: Retrying, Attempts: 1, RetryAt: t0}}), runs: "a", wakeSet: true},
		{name: "expired before it started", v: view([]*Job{job("a", 1, func(j *Job) { j.Expires = t0 })}, nil),
			acks: map[string]State{"a": Expired}},
		{name: "expired while waiting for a retry: failed", v: view([]*Job{job("a", 1, func(j *Job) { j.Expires = t0; j.Retries = 2 })},
			map[string]Ack{"a": {State: Retrying, Last: Failed, Attempts: 1, Error: "boom", RetryAt: t0.Add(time.Hour)}}),
			acks: map[string]State{"a": Failed}},
		{name: "expired while waiting for a retry after a crash: interrupted", v: view([]*Job{job("a", 1, func(j *Job) { j.Expires = t0; j.Retries = 2 })},
			map[string]Ack{"a": {State: Retrying, Last: Interrupted, Attempts: 1, RetryAt: t0.Add(time.Hour)}}),
			acks: map[string]State{"a": Interrupted}},
		{name: "cancelled while waiting for a retry: how the attempt ended", v: view([]*Job{job("a", 1, func(j *Job) { j.Cancelled = true; j.Retries = 2 })},
			map[string]Ack{"a": {State: Retrying, Last: Failed, Attempts: 1, RetryAt: t0.Add(time.Hour)}}),
			acks: map[string]State{"a": Failed}},
		{name: "cancelled before it started", v: view([]*Job{job("a", 1, func(j *Job) { j.Cancelled = true }), job("b", 2)}, nil),
			runs: "b", acks: map[string]State{"a": Cancelled}, wakeSet: true},
		{name: "cancelled while running: it finishes", v: view([]*Job{job("a", 1, func(j *Job) { j.Cancelled = true })},
			map[string]Ack{"a": {State: Running, Attempts: 1}}, "a")},
		{name: "final acks are left alone", v: view([]*Job{job("a", 1, func(j *Job) { j.Expires = t0 })},
			map[string]Ack{"a": {State: Done}})},
		{name: "a full queue drops the oldest", v: func() View {
			v := view([]*Job{job("a", 1), job("b", 2), job("c", 3)}, nil)
			v.MaxQueue = 2
			return v
		}(), runs: "b", acks: map[string]State{"a": Dropped}, wakeSet: true, wantErrs: map[string]string{"a": "more than 2 jobs"}},
		{name: "a running job is never dropped", v: func() View {
			v := view([]*Job{job("a", 1), job("b", 2), job("c", 3)}, map[string]Ack{"a": {State: Running, Attempts: 1}}, "a")
			v.MaxQueue = 1
			return v
		}(), acks: map[string]State{"b": Dropped}, wakeSet: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Decide(tt.v)
			if got := runIDs(p); got != tt.runs {
				t.Errorf("runs %q, want %q", got, tt.runs)
			}
			if len(p.Acks) != len(tt.acks) {
				t.Errorf("acks %v, want %v", p.Acks, tt.acks)
			}
			for id, st := range tt.acks {
				if p.Acks[id].State != st {
					t.Errorf("ack %s: %q, want %q", id, p.Acks[id].State, st)
				}
			}
			for id, s := range tt.wantErrs {
				if !strings.Contains(p.Acks[id].Error, s) {
					t.Errorf("ack %s error %q, want it to say %q", id, p.Acks[id].Error, s)
				}
			}
			if !p.Wake.IsZero() != tt.wakeSet {
				t.Errorf("wake %v, want set: %v", p.Wake, tt.wakeSet)
			}
		})
	}
}

func TestDecideWakesForARetry(t *testing.T) {
	at := t0.Add(90 * time.Second)
	p := Decide(view([]*Job{job("a", 1, func(j *Job) { j.Retries = 1 })},
		map[string]Ack{"a": {State: Retrying, Attempts: 1, RetryAt: at}}))
	if len(p.Runs) != 0 || !p.Wake.Equal(at) {
		t.Fatalf("runs %v, wake %v; want none, wake at %v", p.Runs, p.Wake, at)
	}
}

func TestFinish(t *testing.T) {
	j := job("a", 1, func(j *Job) { j.Retries = 2 })
	now := t0.Add(time.Minute)
	a := Start(Ack{State: Pending}, now)
	if a.State != Running || a.Attempts != 1 || !a.Started.Equal(now) {
		t.Fatalf("start: %+v", a)
	}
	done := Finish(j, a, Result{OK: true, Output: []byte(`"hello"`)}, now.Add(time.Second))
	if done.State != Done || !done.OK || done.OutputBytes != 7 || done.OutputHead != `"hello"` || len(done.OutputDigest) != 64 {
		t.Fatalf("done: %+v", done)
	}
	retry := Finish(j, a, Result{Error: "boom"}, now)
	if retry.State != Retrying || !retry.RetryAt.Equal(now.Add(time.Second)) || retry.Error != "boom" {
		t.Fatalf("first failure of three attempts: %+v", retry)
	}
	a3 := a
	a3.Attempts = 3
	if f := Finish(j, a3, Result{Error: "boom"}, now); f.State != Failed {
		t.Fatalf("third failure: %+v", f)
	}
	if f := Finish(j, a, Result{Error: "boom"}, j.Expires); f.State != Failed {
		t.Fatalf("failure at expiry: %+v", f)
	}
	big := strings.Repeat("é", HeadLen) // 2 bytes each
	h := Finish(j, a, Result{OK: true, Output: []byte(big)}, now)
	if len(h.OutputHead) > HeadLen || h.OutputBytes != len(big) || !strings.HasPrefix(big, h.OutputHead) || len(h.OutputHead) < HeadLen-1 {
		t.Fatalf("head of %d bytes of %d", len(h.OutputHead), h.OutputBytes)
	}
}

func TestBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 6: 32 * time.Second, 7: time.Minute, 11: time.Minute} {
		if got := Backoff(n); got != want {
			t.Errorf("Backoff(%d) = %v, want %v", n, got, want)
		}
	}
}

// fakeHost is a Host over maps.
type fakeHost struct {
	now  time.Time
	jobs []*Job
	acks map[string]Ack
	fail bool
}

func (h *fakeHost) Self() string         { return "self" }
func (h *fakeHost) Now() time.Time       { return h.now }
func (h *fakeHost) Jobs() []*Job         { return h.jobs }
func (h *fakeHost) Known(string) bool    { return true }
func (h *fakeHost) Member(t string) bool { return t == "web" }
func (h *fakeHost) Acks() map[string]Ack { return h.acks }
func (h *fakeHost) PutAck(id string, a Ack) error {
	if h.fail {
		return ErrBadJob
	}
	h.acks[id] = a
	return nil
}

func TestRunner(t *testing.T) {
	h := &fakeHost{now: t0, jobs: []*Job{job("a", 1), job("b", 2)}, acks: map[string]Ack{}}
	var r Runner
	runs, _, err := r.Step(h)
	if err != nil || len(runs) != 1 || runs[0].Job.ID != "a" || h.acks["a"].State != Running {
		t.Fatalf("step: %v %v %+v", runs, err, h.acks)
	}
	// Stepping again while a runs starts nothing and does not call a's
	// running ack a crash.
	if again, _, _ := r.Step(h); len(again) != 0 || h.acks["a"].State != Running {
		t.Fatalf("second step: %v %+v", again, h.acks)
	}
	if err := r.Finish(h, runs[0], Result{OK: true}); err != nil || h.acks["a"].State != Done {
		t.Fatalf("finish: %v %+v", err, h.acks)
	}
	runs, _, _ = r.Step(h)
	if len(runs) != 1 || runs[0].Job.ID != "b" {
		t.Fatalf("after a: %v", runs)
	}
	// A new runner (a restart) finds b's running ack: interrupted.
	var restarted Runner
	if runs, _, _ := restarted.Step(h); len(runs) != 0 || h.acks["b"].State != Interrupted {
		t.Fatalf("after a restart: %v %+v", runs, h.acks["b"])
	}
	// A run whose ack cannot be written does not start.
	h2 := &fakeHost{now: t0, jobs: []*Job{job("a", 1)}, acks: map[string]Ack{}, fail: true}
	var r2 Runner
	if runs, _, err := r2.Step(h2); len(runs) != 0 || err == nil {
		t.Fatalf("with a failing store: %v %v", runs, err)
	}
}

// A job waits for the job it follows until that one is known here, but
// not for one that would be expired whatever its expiry if it came now
// (its id says when it was made): collected with its tombstone before
// this node heard of it, it held the whole queue back forever. One that
// may still come and run holds it back, and so does an id that names no
// time.
func TestAfterThatCanNoLongerRunDoesNotHoldTheQueue(t *testing.T) {
	now := t0.Add(time.Minute) // view's
	for _, c := range []struct {
		name, after string
		runs        string
	}{
		{"made past the longest expiry", NewID(now.Add(-MaxExpiry-time.Millisecond), [4]byte{1}), "j1"},
		{"made just within it", NewID(now.Add(-MaxExpiry+time.Millisecond), [4]byte{1}), ""},
		{"made an hour ago", NewID(now.Add(-time.Hour), [4]byte{1}), ""},
		{"an id naming no time", "j0", ""},
	} {
		j1 := job("j1", 5, func(j *Job) { j.After = c.after })
		j2 := job("j2", 6, func(j *Job) { j.After = "j1" })
		v := view([]*Job{j1, j2}, nil)
		v.Known = func(id string) bool { return id == "j1" || id == "j2" }
		if got := runIDs(Decide(v)); got != c.runs {
			t.Errorf("after a job %s: runs %q, want %q", c.name, got, c.runs)
		}
	}
}

func TestIDTime(t *testing.T) {
	at := time.UnixMilli(1_790_000_000_123).Add(456 * time.Microsecond)
	id := NewID(at, [4]byte{0xde, 0xad, 0xbe, 0xef})
	if got, ok := IDTime(id); !ok || !got.Equal(at.Truncate(time.Millisecond)) {
		t.Errorf("IDTime(%q) = %v %v, want %v", id, got, ok, at.Truncate(time.Millisecond))
	}
	for _, bad := range []string{"j0", "x-deadbeef", "1a2b-xyz", "1a2b-deadbeef-1", "-deadbeef", "1a2b3c4d5e6f7a8b9-deadbeef"} {
		if _, ok := IDTime(bad); ok {
			t.Errorf("IDTime(%q) names a time", bad)
		}
	}
}
