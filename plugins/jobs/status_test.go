package jobs

import (
	"cmp"
	"encoding/json"
	"errors"
	"math/rand"
	"strings"
	"testing"
	"time"
)

// knowing names the nodes ids by their target hashes.
func knowing(ids ...string) func([8]byte) (string, bool) {
	m := map[[8]byte]string{}
	for _, id := range ids {
		m[TargetHash(id)] = id
	}
	return func(h [8]byte) (string, bool) { id, ok := m[h]; return id, ok }
}

func TestSummarize(t *testing.T) {
	j := job("a", 1)
	j.SetTargets([]string{"n1", "n2", "n3", "gone"})
	now := t0.Add(time.Minute)
	acks := map[string]Ack{"n1": {State: Done, Ended: now}, "n2": {State: Running}}
	s := Summarize(j, acks, knowing("n1", "n2", "n3"), now)
	if s.State != Pending || len(s.Targets) != 4 || !s.Finished.IsZero() {
		t.Fatalf("%+v", s)
	}
	states := map[string]State{}
	for _, tg := range s.Targets {
		states[tg.ID+tg.Hash] = tg.Ack.State
	}
	h := TargetHash("gone")
	if states["n1"] != Done || states["n2"] != Running || states["n3"] != Pending || states[string(hexOf(h))] != Pending {
		t.Fatalf("states %v", states)
	}
	// After expiry, targets that never acked are expired and the job failed.
	s = Summarize(j, map[string]Ack{"n1": {State: Done, Ended: now}, "n2": {State: Done, Ended: now}},
		knowing("n1", "n2", "n3"), j.Expires)
	if s.State != Failed || !s.Finished.Equal(j.Expires) {
		t.Fatalf("after expiry: %+v", s)
	}
	// All done: done, finished at the last end.
	j.SetTargets([]string{"n1", "n2"})
	s = Summarize(j, map[string]Ack{"n1": {State: Done, Ended: now}, "n2": {State: Done, Ended: now.Add(time.Second)}}, nil, now)
	if s.State != Done || !s.Finished.Equal(now.Add(time.Second)) {
		t.Fatalf("all done: %+v", s)
	}
	if at := CollectAt(j, s, time.Hour); !at.Equal(j.Expires.Add(time.Hour)) {
		t.Fatalf("collect at %v, not the retention after the expiry", at)
	}
	// A member that joined (include-new) counts once it acked.
	j.IncludeNew = true
	s = Summarize(j, map[string]Ack{"n1": {State: Done}, "n2": {State: Done}, "n4": {State: Failed}}, nil, now)
	if s.State != Failed || len(s.Targets) != 3 {
		t.Fatalf("include-new: %+v", s)
	}
	if at := CollectAt(j, s, time.Hour); !at.Equal(j.Expires.Add(time.Hour)) {
		t.Fatalf("include-new collects after expiry: %v", at)
	}
}

func hexOf(h [8]byte) string {
	const digits = "0123456789abcdef"
	var b strings.Builder
	for _, c := range h {
		b.WriteByte(digits[c>>4])
		b.WriteByte(digits[c&15])
	}
	return b.String()
}

func valid() Job {
	j := Job{ID: "19ab-01", Tribes: []string{"web"}, Plugin: "exec", Method: "run", Args: json.RawMessage(`{"command":"x"}`),
		Created: t0, Expires: t0.Add(DefaultExpiry)}
	j.SetTargets([]string{"a", "b"})
	return j
}

func TestDecode(t *testing.T) {
	good := valid()
	b, _ := json.Marshal(good)
	j, err := Decode(b)
	if err != nil || j.ID != good.ID || j.NumTargets() != 2 || !j.Targeted("a") || j.Targeted("c") {
		t.Fatalf("decode: %+v %v", j, err)
	}
	many := make([]string, MaxTargets)
	for i := range many {
		many[i] = strings.Repeat("x", i%50) + string(rune('a'+i%26)) + time.Duration(i).String()
	}
	full := valid()
	full.Args = json.RawMessage(`"` + strings.Repeat("a", MaxArgs-2) + `"`)
	full.SetTargets(many)
	if b, _ := json.Marshal(full); len(b) > 64<<10 {
		t.Fatalf("a job at every limit is %d bytes: it must fit one entry (64 KiB)", len(b))
	} else if _, err := Decode(b); err != nil {
		t.Fatalf("a job at every limit: %v", err)
	}
	bad := map[string]func(*Job){
		"bad id":           func(j *Job) { j.ID = "A/B" },
		"bad plugin":       func(j *Job) { j.Plugin = "../x" },
		"bad method":       func(j *Job) { j.Method = "" },
		"big args":         func(j *Job) { j.Args = json.RawMessage(`"` + strings.Repeat("a", MaxArgs) + `"`) },
		"no targets":       func(j *Job) { j.Targets = nil },
		"torn targets":     func(j *Job) { j.Targets = j.Targets[:5] },
		"expired at birth": func(j *Job) { j.Expires = j.Created },
		"too long":         func(j *Job) { j.Expires = j.Created.Add(MaxExpiry + time.Second) },
		"retries":          func(j *Job) { j.Retries = MaxRetries + 1 },
		"follows itself":   func(j *Job) { j.After = j.ID },
		"bad tribe":        func(j *Job) { j.Tribes = []string{"Web!"} },
		"timeout":          func(j *Job) { j.Timeout = time.Hour },
	}
	for name, f := range bad {
		j := valid()
		f(&j)
		b, _ := json.Marshal(j)
		if _, err := Decode(b); !errors.Is(err, ErrBadJob) {
			t.Errorf("%s: %v, want ErrBadJob", name, err)
		}
	}
	for name, raw := range map[string]string{
		"not json":      `{`,
		"unknown field": `{"id":"a","evil":1}`,
		"two values":    string(b) + ` {}`,
		"a closing }":   string(b) + `}`, // json.Decoder.More says no more before '}' and ']'
		"a closing ]":   string(b) + ` ]`,
		"oversized":     `"` + strings.Repeat("a", maxJob) + `"`,
	} {
		if _, err := Decode([]byte(raw)); !errors.Is(err, ErrBadJob) {
			t.Errorf("%s: %v, want ErrBadJob", name, err)
		}
	}
}

func TestDecodeAck(t *testing.T) {
	if a, err := DecodeAck([]byte(`{"state":"done","attempts":1,"ok":true}`)); err != nil || a.State != Done {
		t.Fatalf("%+v %v", a, err)
	}
	for name, raw := range map[string]string{
		"pending is never written": `{"state":"pending"}`,
		"unknown state":            `{"state":"won"}`,
		"attempts":                 `{"state":"done","attempts":99}`,
		"head":                     `{"state":"done","output_head":"` + strings.Repeat("a", HeadLen+1) + `"}`,
		"unknown field":            `{"state":"done","x":1}`,
		"a closing }":              `{"state":"done"}}`,
		"a closing ]":              `{"state":"done"}]`,
	} {
		if _, err := DecodeAck([]byte(raw)); !errors.Is(err, ErrBadJob) {
			t.Errorf("%s: %v, want ErrBadJob", name, err)
		}
	}
}

// Progress, fed acks one at a time (new, replaced, deleted, from targets
// and from members outside the set), says pending exactly when Summarize
// of the same acks before the expiry does: over seeded random sequences.
func TestProgressAgreesWithSummarize(t *testing.T) {
	ids := []string{"n1", "n2", "n3", "n4", "n5", "x1", "x2"} // x: outside the set
	states := []State{Running, Retrying, Done, Failed, Interrupted, Expired, Dropped, Cancelled}
	for seed := range int64(300) {
		rng := rand.New(rand.NewSource(seed))
		j := job("a", 1)
		j.IncludeNew = rng.Intn(2) == 0
		targets := ids[:1+rng.Intn(5)]
		j.SetTargets(targets)
		now := t0.Add(time.Minute)
		p := NewProgress(j)
		acks := map[string]Ack{}
		for step := range 40 {
			id := ids[rng.Intn(len(ids))]
			if _, held := acks[id]; held && rng.Intn(5) == 0 {
				delete(acks, id)
				p.Set(id, Ack{}, false)
			} else {
				acks[id] = Ack{State: states[rng.Intn(len(states))]}
				p.Set(id, acks[id], true)
			}
			want := Summarize(j, acks, nil, now).State == Pending
			if got := p.Pending(); got != want {
				t.Fatalf("seed %d, step %d (targets %v, acks %v): Progress says pending %v, Summarize %v", seed, step, targets, acks, got, want)
			}
		}
	}
}

func TestProgressTakesEachAckOnce(t *testing.T) {
	j := job("a", 1, func(j *Job) { j.IncludeNew = true })
	j.SetTargets([]string{"n1", "n2"})
	p := NewProgress(j)
	if !p.Pending() {
		t.Fatal("no ack yet: not pending")
	}
	p.Set("n1", Ack{State: Done}, true)
	p.Set("n1", Ack{State: Done}, true) // the same ack again: counted once
	if !p.Pending() {
		t.Fatal("n2 has not acked: not pending")
	}
	p.Set("n2", Ack{State: Running}, true)
	if !p.Pending() {
		t.Fatal("n2 runs: not pending")
	}
	p.Set("n2", Ack{State: Failed}, true)
	if p.Pending() {
		t.Fatal("both final: pending")
	}
	p.Set("m", Ack{State: Running}, true) // a member that joined (include-new)
	if !p.Pending() {
		t.Fatal("a new member runs it: not pending")
	}
	p.Set("m", Ack{}, false)
	p.Set("n1", Ack{}, false) // n1's ack deleted
	if !p.Pending() {
		t.Fatal("n1's ack is gone: not pending")
	}
}

// A job is collected the retention after it expired or finished,
// whichever is later: never before its expiry, or a copy of it brought
// back (replayed, or by a replica away past the tombstone grace) would
// run again on a target that no longer holds its ack.
func TestCollectAtNeverBeforeTheExpiry(t *testing.T) {
	const retention = 7 * 24 * time.Hour
	j := job("a", 1, func(j *Job) { j.Expires = j.Created.Add(MaxExpiry) })
	j.SetTargets([]string{"n1"})
	for _, c := range []struct {
		name  string
		ended time.Time
		state State
		want  time.Time
	}{
		{"done at once", j.Created.Add(time.Second), Done, j.Expires.Add(retention)},
		{"failed at once", j.Created.Add(time.Second), Failed, j.Expires.Add(retention)},
		{"ended past the expiry", j.Expires.Add(time.Minute), Done, j.Expires.Add(time.Minute + retention)},
		{"pending", time.Time{}, Running, j.Expires.Add(retention)},
		// A target's word on when it ended puts collection off only as
		// far as a run can end: one that says it ended in a thousand
		// years kept the job and every ack of it on the writers as long.
		{"ended past the overdue", j.Overdue().Add(time.Hour), Done, j.Overdue().Add(retention)},
		{"ended in a thousand years", j.Created.AddDate(1000, 0, 0), Failed, j.Overdue().Add(retention)},
	} {
		now := c.ended
		if now.IsZero() {
			now = j.Created
		}
		s := Summarize(j, map[string]Ack{"n1": {State: c.state, Ended: c.ended}}, nil, now)
		if at := CollectAt(j, s, retention); !at.Equal(c.want) {
			t.Errorf("%s: collected at %v, want %v", c.name, at, c.want)
		}
	}
}

// An ack from a peer outside the target set counts only for a job that
// takes new members: for any other, a stranger's failed ack does not
// fail a done job, nor its running ack keep it pending.
func TestAcksFromOutsideTheTargetsCountOnlyForNewMembers(t *testing.T) {
	now := t0.Add(time.Minute)
	for _, includeNew := range []bool{false, true} {
		j := job("a", 1, func(j *Job) { j.IncludeNew = includeNew })
		j.SetTargets([]string{"n1"})
		for _, forged := range []State{Failed, Running} {
			acks := map[string]Ack{"n1": {State: Done, Ended: now}, "x": {State: forged, Ended: now}}
			p := NewProgress(j)
			for id, a := range acks {
				p.Set(id, a, true)
			}
			s := Summarize(j, acks, nil, now)
			want := Done
			if includeNew {
				want = map[State]State{Failed: Failed, Running: Pending}[forged]
			}
			if s.State != want || p.Pending() != (want == Pending) {
				t.Errorf("include-new %v, x %s: state %s, progress pending %v; want %s", includeNew, forged, s.State, p.Pending(), want)
			}
			if n := len(s.Targets); n != 1 && !includeNew {
				t.Errorf("include-new %v: %d rows, want only the target's", includeNew, n)
			}
		}
	}
}

// Past the expiry plus the longest an attempt may last (and AckGrace), an
// ack that is not final is not believed: running is interrupted, retrying
// ends as its last attempt did, so the job ends and a wait with it. Before
// then it stands.
func TestOverdueAcksEnd(t *testing.T) {
	for _, timeout := range []time.Duration{0, time.Minute} {
		j := job("a", 1, func(j *Job) { j.Timeout = timeout })
		j.SetTargets([]string{"n1", "n2"})
		due := j.Expires.Add(cmp.Or(timeout, MaxTimeout) + AckGrace)
		if !j.Overdue().Equal(due) {
			t.Fatalf("timeout %v: overdue at %v, want %v", timeout, j.Overdue(), due)
		}
		for _, c := range []struct {
			ack   Ack
			now   time.Time
			want  State
			state State // the job's, n2 done
		}{
			{Ack{State: Running, Attempts: 1}, due.Add(-time.Nanosecond), Running, Pending},
			{Ack{State: Running, Attempts: 1}, due, Interrupted, Failed},
			{Ack{State: Retrying, Last: Failed, Attempts: 1}, due.Add(-time.Nanosecond), Retrying, Pending},
			{Ack{State: Retrying, Last: Failed, Attempts: 1}, due, Failed, Failed},
			{Ack{State: Retrying, Last: Interrupted, Attempts: 1}, due, Interrupted, Failed},
			{Ack{State: Retrying, Attempts: 1}, due, Failed, Failed},
			{Ack{State: Done, Attempts: 1, Ended: t0}, due.Add(time.Hour), Done, Done},
		} {
			acks := map[string]Ack{"n1": c.ack, "n2": {State: Done, Ended: t0}}
			s := Summarize(j, acks, nil, c.now)
			var got Ack
			for _, tg := range s.Targets {
				if tg.ID == "n1" {
					got = tg.Ack
				}
			}
			if got.State != c.want || s.State != c.state {
				t.Errorf("timeout %v, %s (last %q) at %v: %s, job %s; want %s, job %s",
					timeout, c.ack.State, c.ack.Last, c.now.Sub(due), got.State, s.State, c.want, c.state)
			}
			if c.want != c.ack.State && (!got.Ended.Equal(due) || !got.RetryAt.IsZero() || got.Last != "" || !s.Finished.Equal(due)) {
				t.Errorf("%s at %v: ended %v, finished %v, retry at %v, last %q", c.ack.State, c.now, got.Ended, s.Finished, got.RetryAt, got.Last)
			}
		}
	}
}
