package jobs

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// View is what one node knows when it decides.
type View struct {
	Self string
	Now  time.Time
	// Jobs are the live job entries the node holds.
	Jobs []*Job
	// Known reports whether a job id is or was here (a live entry or a
	// tombstone): what a job's After must be before the job may run.
	Known func(id string) bool
	// Acks are this node's own acks, by job id.
	Acks map[string]Ack
	// Running are the jobs this process is running now. An ack that says
	// running for a job not in here is a run a crash cut short.
	Running map[string]bool
	// Member reports whether this node's membership of a tribe counts
	// (for jobs that take new members).
	Member func(tribe string) bool
	// MaxQueue is how many jobs may wait in one queue (0: DefaultQueue).
	MaxQueue int
}

// Plan is what the node must do now.
type Plan struct {
	// Acks to write, by job id: jobs that end here without a run
	// (expired, dropped, cancelled, interrupted) or wait for a retry.
	Acks map[string]Ack
	// Runs to start, in order: write each one's ack as running, durably,
	// and only then call the plugin.
	Runs []*Job
	// Wake is when to decide again although nothing changed (a retry
	// becomes due, a waiting job expires); zero for never.
	Wake time.Time
}

// Mine reports whether the job is this node's to run: in its fixed target
// set, or a job that takes new members of a tribe this node is in.
func (v *View) Mine(j *Job) bool {
	if _, ok := v.Acks[j.ID]; ok || j.Targeted(v.Self) {
		return true
	}
	if j.IncludeNew && v.Now.Before(j.Expires) && v.Member != nil {
		return slices.ContainsFunc(j.Tribes, v.Member)
	}
	return false
}

// Decide is the whole rule of a target:
//   - an ack that says running for a job this process does not run is a
//     crash: retrying after a backoff if the job allows another attempt,
//     else interrupted;
//   - a cancelled job that has not started ends cancelled;
//   - a job past its expiry that has not started ends expired (failed if
//     it had failed attempts and waits for a retry);
//   - each queue (the job's first tribe) holds at most MaxQueue waiting
//     jobs: past that the oldest end dropped;
//   - each queue runs one job at a time in the order (Seq, Created, ID),
//     and a job waits until its After is known here (through parallel
//     jobs, to the queued one before them: see follows); parallel jobs run
//     as soon as they may, beside the queue.
func Decide(v View) Plan {
	p := Plan{Acks: map[string]Ack{}}
	maxQueue := v.MaxQueue
	if maxQueue <= 0 {
		maxQueue = DefaultQueue
	}
	wake := func(t time.Time) {
		if !t.IsZero() && (p.Wake.IsZero() || t.Before(p.Wake)) {
			p.Wake = t
		}
	}
	queues := map[string][]*Job{}
	for _, j := range v.Jobs {
		if !v.Mine(j) {
			continue
		}
		a, acked := v.Acks[j.ID]
		if acked && a.State.Final() {
			continue
		}
		if v.Running[j.ID] {
			queues[j.Queue()] = append(queues[j.Queue()], j)
			continue
		}
		if acked && a.State == Running { // a crash cut this attempt short
			a.Ended = v.Now
			a.Error = fmt.Sprintf("interrupted: the node stopped during attempt %d", a.Attempts)
			if a.Attempts <= j.Retries && v.Now.Before(j.Expires) && !j.Cancelled {
				a.State, a.Last, a.RetryAt = Retrying, Interrupted, v.Now.Add(Backoff(a.Attempts))
			} else {
				a.State = Interrupted
			}
			p.Acks[j.ID] = a
			if a.State == Interrupted {
				continue
			}
		}
		switch {
		case j.Cancelled && a.State == Retrying:
			a.State, a.Ended, a.RetryAt, a.Last = a.Last, v.Now, time.Time{}, ""
			p.Acks[j.ID] = a
			continue
		case j.Cancelled:
			a.State, a.Ended, a.RetryAt, a.Last = Cancelled, v.Now, time.Time{}, ""
			p.Acks[j.ID] = a
			continue
		case !v.Now.Before(j.Expires):
			if a.State == Retrying {
				a.State = a.Last // the retry it waited for is too late
			} else {
				a.State = Expired
			}
			a.Ended, a.RetryAt, a.Last = v.Now, time.Time{}, ""
			p.Acks[j.ID] = a
			continue
		}
		wake(j.Expires)
		queues[j.Queue()] = append(queues[j.Queue()], j)
	}
	live := make(map[string]*Job, len(v.Jobs))
	for _, j := range v.Jobs {
		live[j.ID] = j
	}
	for _, q := range queues {
		Sort(q)
		// Bound the waiting (not running) jobs: drop the oldest.
		waiting := 0
		for _, j := range q {
			if !v.Running[j.ID] {
				waiting++
			}
		}
		for i := 0; waiting > maxQueue && i < len(q); i++ {
			j := q[i]
			if v.Running[j.ID] {
				continue
			}
			a := current(v, p, j.ID)
			a.State, a.Ended, a.RetryAt, a.Last = Dropped, v.Now, time.Time{}, ""
			a.Error = fmt.Sprintf("dropped: more than %d jobs waited in queue %q on this node; the oldest went", maxQueue, j.Queue())
			p.Acks[j.ID] = a
			waiting--
		}
		busy := false // a queued job runs here now
		for _, j := range q {
			a := current(v, p, j.ID)
			if a.State.Final() {
				continue
			}
			if v.Running[j.ID] {
				if !j.Parallel {
					busy = true
				}
				continue
			}
			ready := v.follows(j, live)
			if a.State == Retrying && v.Now.Before(a.RetryAt) {
				wake(a.RetryAt)
				ready = false
			}
			if j.Parallel {
				if ready {
					p.Runs = append(p.Runs, j)
				}
				continue
			}
			if !ready || busy {
				busy = true // what follows waits for this one
				continue
			}
			p.Runs = append(p.Runs, j)
			busy = true
		}
	}
	slices.SortFunc(p.Runs, order)
	return p
}

// follows reports whether j may run as far as its place in the queue goes:
// the job it follows is known here, or could not run here if it came
// (pastRunning). A queued job's After may be a parallel
// job, which runs beside the queue and so orders nothing: then the job
// before that must be known too, and so on, until a queued job (the queue's
// order does the rest) or the start of the queue. A parallel job needs only
// its own After.
// The walk is bounded by the jobs there are: parallel jobs that follow
// each other in a circle (no writer makes one; a broken one could) hold
// the queue back instead of the loop.
func (v View) follows(j *Job, live map[string]*Job) bool {
	id := j.After
	for range len(live) + 1 {
		if id == "" {
			return true
		}
		if v.Known != nil && !v.Known(id) {
			return v.pastRunning(id)
		}
		p, ok := live[id]
		if !ok || !p.Parallel || j.Parallel {
			return true
		}
		id = p.After
	}
	return false
}

// pastRunning reports whether job id, not known here, would be expired
// if it came now, whatever its expiry: its id says when it was made, and
// no job expires later than MaxExpiry after. Such a job never runs here,
// so a job after it has nothing to wait for; without this, a job whose
// predecessor was collected (tombstone included) before this node heard
// of it held its queue back forever. One that may still come and run
// holds it back, as before; so does an id that names no time.
func (v View) pastRunning(id string) bool {
	made, ok := IDTime(id)
	return ok && !v.Now.Before(made.Add(time.Millisecond+MaxExpiry))
}

// current is j's ack as the plan leaves it so far.
func current(v View, p Plan, id string) Ack {
	if a, ok := p.Acks[id]; ok {
		return a
	}
	a := v.Acks[id]
	if a.State == "" {
		a.State = Pending
	}
	return a
}

// Start is the ack written, durably, before attempt of j starts.
func Start(a Ack, now time.Time) Ack {
	a.State = Running
	a.Attempts++
	a.Started, a.Ended, a.RetryAt = now, time.Time{}, time.Time{}
	a.OK, a.Error = false, ""
	return a
}

// Host is what a Runner needs of the node it runs on.
type Host interface {
	Self() string
	Now() time.Time
	Jobs() []*Job
	Known(id string) bool
	Acks() map[string]Ack
	Member(tribe string) bool
	// PutAck writes this node's ack for job id, durably, before it
	// returns.
	PutAck(id string, a Ack) error
}

// Runner applies Decide on a node and keeps which jobs this process runs.
// It is safe for concurrent use.
type Runner struct {
	MaxQueue int

	mu      sync.Mutex
	running map[string]Ack
}

// A Run is a job to call now, with the ack written as it started.
type Run struct {
	Job *Job
	Ack Ack
}

// Step decides and writes what the plan says: the acks, then each run's
// running ack. It returns the runs to start and when to step again. A
// run whose ack could not be written is not started.
func (r *Runner) Step(h Host) ([]Run, time.Time, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	running := make(map[string]bool, len(r.running))
	for id := range r.running {
		running[id] = true
	}
	acks := h.Acks()
	p := Decide(View{Self: h.Self(), Now: h.Now(), Jobs: h.Jobs(), Known: h.Known, Acks: acks,
		Running: running, Member: h.Member, MaxQueue: r.MaxQueue})
	var errs []error
	for id, a := range p.Acks {
		if err := h.PutAck(id, a); err != nil {
			errs = append(errs, err)
		}
	}
	var runs []Run
	for _, j := range p.Runs {
		a, ok := p.Acks[j.ID]
		if !ok {
			a = acks[j.ID]
		}
		a = Start(a, h.Now())
		if err := h.PutAck(j.ID, a); err != nil {
			errs = append(errs, err)
			continue
		}
		if r.running == nil {
			r.running = map[string]Ack{}
		}
		r.running[j.ID] = a
		runs = append(runs, Run{Job: j, Ack: a})
	}
	if len(errs) > 0 {
		return runs, p.Wake, fmt.Errorf("jobs: writing acks: %w", errs[0])
	}
	return runs, p.Wake, nil
}

// Finish writes how run ended, and forgets it as running (after the ack
// is written: a crash in between finds the running ack and reports the
// run interrupted).
func (r *Runner) Finish(h Host, run Run, res Result) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := h.PutAck(run.Job.ID, Finish(run.Job, run.Ack, res, h.Now()))
	delete(r.running, run.Job.ID)
	return err
}
