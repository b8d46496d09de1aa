// Package jobs is the pure core of durable jobs: a plugin call that must
// reach every target, even one that is down when it is submitted.
//
// A trusted writer writes the job as the entry jobs/<id>, with its target
// set fixed at submission. Each target writes its own acknowledgement,
// jobs/<id>/acks/<peer>, signed by itself alone, and that ack is also the
// target's journal: it is stored (bbolt, fsync) as "running" before the
// plugin runs, so a target that crashes mid-run finds it on restart and
// reports the job interrupted instead of running it a second time.
//
// This package decides, from what a node knows (the jobs, its own acks, the
// clock), what the node must do: which job runs next, which are expired,
// dropped or cancelled, how a finished run is reported, what a job's state
// is across its targets, and when it may be collected. It does no I/O and
// reads no clock: the node (and the property test's model) call it.
package jobs

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/internal/strictjson"
)

// Limits of a job. They keep one job inside one replicated entry (64 KiB):
// a target is 8 bytes, so 5,000 targets take 53 KiB of the entry once
// base64-encoded.
const (
	MaxArgs       = 8 << 10
	MaxTargets    = 5000
	MaxTribes     = 16
	MaxRetries    = 10
	DefaultExpiry = 24 * time.Hour
	MaxExpiry     = 30 * 24 * time.Hour
	// MaxTimeout caps an attempt's timeout.
	MaxTimeout = 10 * time.Minute
	// DefaultQueue is how many jobs a node holds waiting per queue before
	// it drops the oldest.
	DefaultQueue = 1000
	// DefaultRetention is how long a finished job and its acks are kept.
	DefaultRetention = 7 * 24 * time.Hour
	// HeadLen is how much of a run's output its ack carries.
	HeadLen = 1024
	// MaxError caps an ack's error text.
	MaxError = 1024
	// MaxBackoff caps the wait before a retry.
	MaxBackoff = time.Minute
	// maxJob and maxAck bound what Decode and DecodeAck read.
	maxJob = 64 << 10 // one entry's value (gossip.MaxValueLen)
	maxAck = 4 << 10
)

// State is where a job stands on one target.
type State string

const (
	Pending     State = "pending"     // the target has not started it (or not seen it yet)
	Running     State = "running"     // an attempt is under way
	Retrying    State = "retrying"    // an attempt failed or was interrupted; another follows at RetryAt
	Done        State = "done"        // it ran and succeeded
	Failed      State = "failed"      // it ran and failed, with no retry left
	Interrupted State = "interrupted" // the target crashed while it ran, with no retry left
	Expired     State = "expired"     // it expired before the target could run it
	Dropped     State = "dropped"     // the target's queue was full: the oldest waiting job went
	Cancelled   State = "cancelled"   // cancelled before the target started it
)

// Final reports whether s is the end of the job on that target.
func (s State) Final() bool {
	switch s {
	case Done, Failed, Interrupted, Expired, Dropped, Cancelled:
		return true
	}
	return false
}

// Job is the value of jobs/<id>.
type Job struct {
	ID     string          `json:"id"`
	Tribes []string        `json:"tribes,omitempty"` // the --tribe names; the first is the job's queue
	Plugin string          `json:"plugin"`
	Method string          `json:"method"`
	Args   json.RawMessage `json:"args,omitempty"`
	// Targets is the set fixed at submission: TargetHash of each peer ID.
	Targets    []byte        `json:"targets"`
	IncludeNew bool          `json:"include_new,omitempty"` // members who join a tribe before expiry run it too
	Parallel   bool          `json:"parallel,omitempty"`    // outside the queue: runs beside the others
	Created    time.Time     `json:"created"`
	Expires    time.Time     `json:"expires"`
	Retries    int           `json:"retries,omitempty"`
	Timeout    time.Duration `json:"timeout,omitempty"` // per attempt; 0 is the plugin call default
	// After and Seq order a queue: After is the last job of the queue the
	// writer knew, Seq one more than its Seq. A target runs a job only
	// once it knows After, so it never runs a queue out of order because
	// the later job reached it first.
	After     string `json:"after,omitempty"`
	Seq       uint64 `json:"seq"`
	Cancelled bool   `json:"cancelled,omitempty"`
}

// NewID is a job's id made at now: milliseconds since the epoch in hex,
// then 4 random bytes in hex; sortable by submission time, and it says
// when the job was made (IDTime) to a node that never held the job.
func NewID(now time.Time, random [4]byte) string {
	return fmt.Sprintf("%x-%s", now.UnixMilli(), hex.EncodeToString(random[:]))
}

// IDTime is the millisecond in which NewID made id, if it did: a job's
// Created is before the end of it.
func IDTime(id string) (time.Time, bool) {
	ms, rest, ok := strings.Cut(id, "-")
	if !ok || len(ms) == 0 || len(ms) > 15 || len(rest) != 8 {
		return time.Time{}, false
	}
	if _, err := hex.DecodeString(rest); err != nil {
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(ms, 16, 64)
	if err != nil || n < 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(n), true
}

// Queue names the job's queue: its first tribe, or "" for a job sent only
// to named nodes.
func (j *Job) Queue() string {
	if len(j.Tribes) == 0 {
		return ""
	}
	return j.Tribes[0]
}

// TargetHash is how a target is written into a job: the first 8 bytes of
// the SHA-256 of its peer ID's text.
func TargetHash(id string) [8]byte {
	sum := sha256.Sum256([]byte(id))
	return [8]byte(sum[:8])
}

// SetTargets writes ids as the job's target set.
func (j *Job) SetTargets(ids []string) {
	j.Targets = make([]byte, 0, 8*len(ids))
	seen := map[[8]byte]bool{}
	for _, id := range ids {
		h := TargetHash(id)
		if !seen[h] {
			seen[h] = true
			j.Targets = append(j.Targets, h[:]...)
		}
	}
}

// Targeted reports whether id is in the job's fixed target set.
func (j *Job) Targeted(id string) bool {
	h := TargetHash(id)
	for i := 0; i+8 <= len(j.Targets); i += 8 {
		if bytes.Equal(j.Targets[i:i+8], h[:]) {
			return true
		}
	}
	return false
}

// NumTargets is the size of the fixed target set.
func (j *Job) NumTargets() int { return len(j.Targets) / 8 }

// ErrBadJob is a job or an ack that cannot be read or breaks a limit.
var ErrBadJob = errors.New("jobs: bad job")

// Check reports the first way j breaks the rules, or nil.
func (j *Job) Check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrBadJob, fmt.Sprintf(format, a...))
	}
	switch {
	case !names.Valid(j.ID):
		return bad("id %q is not a job id", j.ID)
	case !names.Valid(j.Plugin):
		return bad("plugin %q is not a plugin name", j.Plugin)
	case !names.ValidMethod(j.Method):
		return bad("method %q is not a method name", j.Method)
	case len(j.Args) > MaxArgs:
		return bad("arguments of %d bytes, at most %d", len(j.Args), MaxArgs)
	case len(j.Args) > 0 && !json.Valid(j.Args):
		return bad("the arguments are not JSON")
	case len(j.Tribes) > MaxTribes:
		return bad("%d tribes, at most %d", len(j.Tribes), MaxTribes)
	case len(j.Targets)%8 != 0:
		return bad("target set of %d bytes is not whole targets", len(j.Targets))
	case j.NumTargets() > MaxTargets:
		return bad("%d targets, at most %d: submit several jobs", j.NumTargets(), MaxTargets)
	case j.NumTargets() == 0 && !j.IncludeNew:
		return bad("no targets")
	case j.Created.IsZero() || !j.Expires.After(j.Created):
		return bad("expires %v is not after created %v", j.Expires, j.Created)
	case j.Expires.Sub(j.Created) > MaxExpiry:
		return bad("expires %v after it was created, at most %v", j.Expires.Sub(j.Created), MaxExpiry)
	case j.Retries < 0 || j.Retries > MaxRetries:
		return bad("%d retries, from 0 to %d", j.Retries, MaxRetries)
	case j.Timeout < 0 || j.Timeout > MaxTimeout:
		return bad("timeout %v, from 0 to %v", j.Timeout, MaxTimeout)
	case j.After != "" && !names.Valid(j.After):
		return bad("after %q is not a job id", j.After)
	case j.After == j.ID:
		return bad("a job cannot follow itself")
	}
	for _, t := range j.Tribes {
		if !names.Valid(t) {
			return bad("tribe %q is not a tribe name", t)
		}
	}
	return nil
}

// Decode reads a job entry's value from the network: strict JSON, no
// unknown fields, within the limits.
func Decode(b []byte) (Job, error) {
	var j Job
	if len(b) > maxJob {
		return j, fmt.Errorf("%w: %d bytes, at most %d", ErrBadJob, len(b), maxJob)
	}
	if err := strictJSON(b, &j); err != nil {
		return Job{}, err
	}
	if err := j.Check(); err != nil {
		return Job{}, err
	}
	return j, nil
}

// Ack is the value of jobs/<id>/acks/<peer>: where the job stands on that
// peer, written by that peer only.
type Ack struct {
	State    State     `json:"state"`
	Attempts int       `json:"attempts,omitempty"`
	Started  time.Time `json:"started,omitzero"`
	Ended    time.Time `json:"ended,omitzero"`
	RetryAt  time.Time `json:"retry_at,omitzero"`
	// Last is how the last attempt ended (Failed or Interrupted) while
	// the state is Retrying: what the target ends with if the job expires
	// or is cancelled before the retry.
	Last  State  `json:"last,omitempty"`
	OK    bool   `json:"ok,omitempty"`
	Error string `json:"error,omitempty"`
	// The run's output: its size and SHA-256 (hex) and its first HeadLen
	// bytes. The whole output stays on the target (`tribe job output`).
	OutputBytes  int    `json:"output_bytes,omitempty"`
	OutputDigest string `json:"output_digest,omitempty"`
	OutputHead   string `json:"output_head,omitempty"`
}

// Check reports the first way a breaks the rules, or nil.
func (a *Ack) Check() error {
	switch {
	case !a.State.Final() && a.State != Running && a.State != Retrying:
		return fmt.Errorf("%w: ack state %q", ErrBadJob, a.State)
	case a.Attempts < 0 || a.Attempts > MaxRetries+1:
		return fmt.Errorf("%w: %d attempts", ErrBadJob, a.Attempts)
	case a.Last != "" && a.Last != Failed && a.Last != Interrupted:
		return fmt.Errorf("%w: last attempt %q", ErrBadJob, a.Last)
	case len(a.Error) > MaxError:
		return fmt.Errorf("%w: error of %d bytes, at most %d", ErrBadJob, len(a.Error), MaxError)
	case len(a.OutputHead) > HeadLen:
		return fmt.Errorf("%w: output head of %d bytes, at most %d", ErrBadJob, len(a.OutputHead), HeadLen)
	case a.OutputBytes < 0:
		return fmt.Errorf("%w: output of %d bytes", ErrBadJob, a.OutputBytes)
	}
	return nil
}

// DecodeAck reads an ack entry's value from the network.
func DecodeAck(b []byte) (Ack, error) {
	var a Ack
	if len(b) > maxAck {
		return a, fmt.Errorf("%w: ack of %d bytes, at most %d", ErrBadJob, len(b), maxAck)
	}
	if err := strictJSON(b, &a); err != nil {
		return Ack{}, err
	}
	if err := a.Check(); err != nil {
		return Ack{}, err
	}
	return a, nil
}

func strictJSON(b []byte, v any) error {
	if err := strictjson.Decode(b, v); err != nil {
		return fmt.Errorf("%w: %v", ErrBadJob, err)
	}
	return nil
}

// Result is how one attempt went.
type Result struct {
	OK     bool
	Output []byte // the plugin's answer, as much as the node kept
	Error  string
}

// Backoff is the wait before retry n (1-based): 1 s, 2 s, 4 s ... at most
// MaxBackoff.
func Backoff(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	if n > 7 {
		return MaxBackoff
	}
	return min(time.Second<<(n-1), MaxBackoff)
}

// Finish is the ack for attempt a of j ending with r at now: done, or on
// failure retrying (while retries are left, the job has not expired and
// was not cancelled) or failed.
func Finish(j *Job, a Ack, r Result, now time.Time) Ack {
	a.Ended = now
	a.OK = r.OK
	a.Error = clip(r.Error, MaxError)
	a.OutputBytes = len(r.Output)
	a.OutputDigest, a.OutputHead = "", ""
	if len(r.Output) > 0 {
		sum := sha256.Sum256(r.Output)
		a.OutputDigest = hex.EncodeToString(sum[:])
		a.OutputHead = clip(string(r.Output), HeadLen)
	}
	switch {
	case r.OK:
		a.State = Done
	case a.Attempts <= j.Retries && now.Before(j.Expires) && !j.Cancelled:
		a.State, a.Last, a.RetryAt = Retrying, Failed, now.Add(Backoff(a.Attempts))
	default:
		a.State = Failed
	}
	return a
}

// HeadHoldsAll reports whether out travels whole in its ack's head, so
// the target need not keep a copy of its own: at most HeadLen bytes of
// UTF-8 (JSON would replace anything else).
func HeadHoldsAll(out []byte) bool { return len(out) <= HeadLen && utf8.Valid(out) }

// clip cuts s to at most n bytes without splitting a UTF-8 sequence.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// order sorts a queue: by Seq, then creation, then id.
func order(a, b *Job) int {
	switch {
	case a.Seq != b.Seq:
		if a.Seq < b.Seq {
			return -1
		}
		return 1
	case !a.Created.Equal(b.Created):
		return a.Created.Compare(b.Created)
	}
	return compareStrings(a.ID, b.ID)
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Sort orders jobs as their queues run them.
func Sort(js []*Job) { slices.SortFunc(js, order) }
