package jobs

import (
	"cmp"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Target is one row of a job's status.
type Target struct {
	ID  string // the peer ID; "" for a target no node here is known by
	Ack Ack    // State is Pending (or Expired past the expiry) without an ack
	// Hash is the target's hash as the job holds it (hex), for a target
	// whose node is not known here.
	Hash string
}

// Summary is a job's state across its targets.
type Summary struct {
	// State is Pending while any target may still run it, else Done if
	// every target is done, else Failed.
	State   State
	Targets []Target
	// Finished is when the last target ended (zero while pending).
	Finished time.Time
}

// Summarize puts together a job's targets, from the acks written (by peer
// ID) and known, which names a node known here by its target hash (to name
// the targets that have not acked; nil knows none). A target that never acked is pending, or expired once
// the job has expired. A job that takes new members counts the acks of
// peers outside its target set too (the caller passes only those of
// members, whose membership counts); any other job ignores them: a
// stranger's ack neither fails the job nor keeps it pending.
func Summarize(j *Job, acks map[string]Ack, known func(h [8]byte) (id string, ok bool), now time.Time) Summary {
	byHash := make(map[[8]byte]string, len(acks))
	for id := range acks {
		byHash[TargetHash(id)] = id
	}
	s := Summary{Targets: make([]Target, 0, j.NumTargets()+len(acks))}
	seen := make(map[string]bool, len(acks))
	for i := 0; i+8 <= len(j.Targets); i += 8 {
		h := [8]byte(j.Targets[i : i+8])
		id, ok := byHash[h]
		if !ok && known != nil {
			id, ok = known(h)
		}
		if !ok {
			s.Targets = append(s.Targets, Target{Hash: hex.EncodeToString(h[:]), Ack: unacked(j, now)})
			continue
		}
		seen[id] = true
		a, ok := acks[id]
		if !ok {
			a = unacked(j, now)
		}
		s.Targets = append(s.Targets, Target{ID: id, Ack: overdue(j, a, now)})
	}
	for id, a := range acks { // new members of a tribe (IncludeNew)
		if !seen[id] && j.IncludeNew {
			s.Targets = append(s.Targets, Target{ID: id, Ack: overdue(j, a, now)})
		}
	}
	slices.SortFunc(s.Targets, func(a, b Target) int { return strings.Compare(a.sortKey(), b.sortKey()) })
	s.State = Done
	for _, t := range s.Targets {
		switch {
		case !t.Ack.State.Final():
			s.State = Pending
		case t.Ack.State != Done && s.State == Done:
			s.State = Failed
		}
		if t.Ack.Ended.After(s.Finished) {
			s.Finished = t.Ack.Ended
		}
	}
	if s.State == Pending {
		s.Finished = time.Time{}
	} else if !j.Expires.After(now) && s.Finished.Before(j.Expires) {
		s.Finished = j.Expires // targets that expired unacked ended then
	}
	return s
}

// sortKey orders a summary's rows: by peer ID, or by hash for a target
// not known here (a row has one or the other).
func (t *Target) sortKey() string {
	if t.ID != "" {
		return t.ID
	}
	return t.Hash
}

// Progress follows one job across its targets as their acks change, for
// a waiter that must learn when each target finishes and when the last
// does: taking an ack costs the same whatever the job's size, where
// Summarize looks at every target (a wait that summarized the job at each
// ack cost its writer 16 ms of CPU an ack at 5,000 targets). It knows
// only what acks say: past the job's expiry, targets that never acked
// are expired, which Summarize tells.
type Progress struct {
	targets    map[[8]byte]bool
	includeNew bool            // acks from outside the target set count (see Summarize)
	n          int             // the target set's size
	acks       map[string]bool // the acks held, by peer ID: whether final
	final      int             // final acks of targets
	open       int             // acks not final of members outside the set (IncludeNew)
}

// NewProgress follows j, with no ack taken yet.
func NewProgress(j *Job) *Progress {
	p := &Progress{targets: make(map[[8]byte]bool, j.NumTargets()), includeNew: j.IncludeNew, acks: map[string]bool{}}
	for i := 0; i+8 <= len(j.Targets); i += 8 {
		p.targets[[8]byte(j.Targets[i:i+8])] = true
	}
	p.n = len(p.targets)
	return p
}

// Set takes the ack that peer id holds now (held false: none, as after a
// deletion) in place of the one it held.
func (p *Progress) Set(id string, a Ack, held bool) {
	target := p.targets[TargetHash(id)]
	if final, ok := p.acks[id]; ok {
		switch {
		case target && final:
			p.final--
		case !target && !final:
			p.open--
		}
		delete(p.acks, id)
	}
	if !held || !target && !p.includeNew {
		return
	}
	final := a.State.Final()
	p.acks[id] = final
	switch {
	case target && final:
		p.final++
	case !target && !final:
		p.open++
	}
}

// Pending reports whether some target has not finished, as its acks say:
// one that has not acked, or whose ack is not final.
func (p *Progress) Pending() bool { return p.final < p.n || p.open > 0 }

// AckGrace is how long after the last attempt can have ended a target's
// final ack may still be on its way: most go at once, on the job's
// stream or by push; the writer asks for missed ones every 10 s.
const AckGrace = 10 * time.Second

// Overdue is when j's acks that are not final stop being believed: no
// attempt starts past the expiry, and one under way then ends within its
// timeout (MaxTimeout if the job names none: which default applies is
// the target's business), plus AckGrace. A target still running then
// died or was cut off mid-run, and one retrying will not retry.
func (j *Job) Overdue() time.Time {
	t := j.Timeout
	if t == 0 {
		t = MaxTimeout
	}
	return j.Expires.Add(t + AckGrace)
}

// overdue is ack a of j as a summary at now tells it: past j.Overdue, a
// running ack is interrupted and a retrying one ends as its last attempt
// did, as the target itself would end them (Decide), so that the job
// ends and `job wait` with it.
func overdue(j *Job, a Ack, now time.Time) Ack {
	if a.State.Final() || now.Before(j.Overdue()) {
		return a
	}
	switch a.State {
	case Running:
		a.State = Interrupted
		a.Error = fmt.Sprintf("interrupted: no end of attempt %d reported by the job's expiry and its timeout", a.Attempts)
	case Retrying:
		a.State = cmp.Or(a.Last, Failed)
	}
	a.Ended, a.RetryAt, a.Last = j.Overdue(), time.Time{}, ""
	return a
}

// unacked is the state of a target that wrote no ack.
func unacked(j *Job, now time.Time) Ack {
	if now.Before(j.Expires) {
		return Ack{State: Pending}
	}
	return Ack{State: Expired}
}

// CollectAt is when a job and its acks may be deleted: retention after it
// expired, or after it finished if that was later (a run that ended past
// the expiry). Never before the expiry, however early it finished: once
// its entry and its tombstone are gone, a replayed entry or a replica
// away longer than the tombstone grace brings the job back, and a target
// that lost its ack, asking a writer that forgot it too, would run it a
// second time; back after its expiry, it is only acked expired. Nor later
// than the retention after j.Overdue, by when every attempt has ended or
// counts as interrupted: when a target ended is its own word, and one
// that said it ended in a thousand years kept the job and every ack of
// it on the writers as long.
func CollectAt(j *Job, s Summary, retention time.Duration) time.Time {
	at := j.Expires
	if s.State != Pending && s.Finished.After(at) {
		at = s.Finished
		if due := j.Overdue(); at.After(due) {
			at = due
		}
	}
	return at.Add(retention)
}
