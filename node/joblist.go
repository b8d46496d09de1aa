package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	msmux "github.com/multiformats/go-multistream"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/internal/strictjson"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins/jobs"
)

// JobListProtocol answers `tribe job list` asked on a node that does not
// hold the targets' acks (with a trust list, only trusted writers do:
// acks travel to them alone). Pulling everything from the writers
// instead, as such a node did, left it holding every ack of every job
// until the jobs were collected: at 5,000 targets and 1,000 jobs, 5
// million entries fetched, checked and kept for one command. The request
// is one line {"tribe": "<name, or empty for all>"}; the answer one line
// {"jobs": [...]} (as `job list --json` prints them) or {"error": "..."}.
// A trusted writer answers admitted nodes, a few at a time.
const JobListProtocol = "/tribe/job-list/1.0.0"

const (
	// jobListRequestMax bounds a request line.
	jobListRequestMax = 256
	// jobListAnswerMax bounds an answer: past it the writer says so,
	// and the asker pulls from the writers as it did.
	jobListAnswerMax = 32 << 20
	// maxListServing bounds the lists a writer makes at once (each reads
	// every job and its acks), one per peer.
	maxListServing = 4
	// jobListTimeout bounds asking one writer.
	jobListTimeout = 10 * time.Second
)

// decodeJobListRequest reads a request line, refusing anything else.
func decodeJobListRequest(line []byte) (string, error) {
	var req struct {
		Tribe *string `json:"tribe"`
	}
	if err := strictjson.Decode(line, &req); err != nil {
		return "", fmt.Errorf("not a job list request: %w", err)
	}
	if req.Tribe == nil {
		return "", errors.New("not a job list request: no tribe (empty for all)")
	}
	if *req.Tribe != "" && !gossip.ValidName(*req.Tribe) {
		return "", fmt.Errorf("tribe %q is not a tribe name", *req.Tribe)
	}
	return *req.Tribe, nil
}

type jobListAnswer struct {
	Jobs  []api.Job `json:"jobs,omitempty"`
	Error string    `json:"error,omitempty"`
}

// decodeJobListAnswer reads a writer's answer: its jobs, each with a
// job's id and a known state, or its error. Fields this version does not
// know are let through (a later writer may add some).
func decodeJobListAnswer(b []byte) ([]api.Job, error) {
	var a jobListAnswer
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&a); err != nil {
		return nil, fmt.Errorf("%w: %w", errNotJobList, err)
	}
	if a.Error != "" {
		return nil, errors.New(a.Error)
	}
	for _, j := range a.Jobs {
		if !gossip.ValidName(j.ID) {
			return nil, fmt.Errorf("%w: job id %q", errNotJobList, j.ID)
		}
		if !slices.Contains(jobStates, j.State) {
			return nil, fmt.Errorf("%w: job %s in state %q", errNotJobList, j.ID, j.State)
		}
	}
	if a.Jobs == nil {
		a.Jobs = []api.Job{}
	}
	return a.Jobs, nil
}

// errNotJobList is a writer's answer to a list request that does not
// read as one (counted, job_list_bad_answer).
var errNotJobList = errors.New("not a job list")

// jobStates are the states a job as a whole can be in.
var jobStates = []string{"pending", "done", "failed"}

// holdsAllAcks reports whether this node holds the acks of every job it
// knows: a trusted writer, or any node without a trust list.
func (n *Node) holdsAllAcks() bool {
	t := n.replica.Trust()
	return t.Open() || t.Trusted(n.host.ID())
}

// serveJobList is a writer's side. Whom it refuses, it refuses before it
// takes a slot: nodes that are not admitted cost nothing to make, and
// must not hold the slots of those that are.
func (n *Node) serveJobList(s network.Stream) {
	from := s.Conn().RemotePeer()
	defer s.Close()
	s.SetDeadline(time.Now().Add(requestTimeout))
	answer := func(a jobListAnswer) error {
		b, err := json.Marshal(a)
		if err != nil {
			return err
		}
		if len(b) > jobListAnswerMax {
			b, _ = json.Marshal(jobListAnswer{Error: fmt.Sprintf("the list is over %d MiB", jobListAnswerMax>>20)})
		}
		s.SetWriteDeadline(time.Now().Add(watchWriteTimeout))
		_, err = s.Write(append(b, '\n'))
		return err
	}
	if !n.rules().Counts(from) {
		n.jobs.listRefused.Add(1)
		answer(jobListAnswer{Error: fmt.Sprintf("%s is not admitted: only admitted nodes list jobs", from)})
		return
	}
	if n.replica.Penalised(from) || !n.jobs.listing.Acquire(from) {
		n.jobs.listRefused.Add(1)
		answer(jobListAnswer{Error: "busy: listing for other nodes (or for this one already); try again"})
		return
	}
	defer n.jobs.listing.Release(from)
	line, err := readFirstRequest(s, jobListRequestMax)
	var tribe string
	if err == nil {
		tribe, err = decodeJobListRequest(line)
	}
	switch {
	case err != nil:
		n.jobs.listRefused.Add(1)
		answer(jobListAnswer{Error: "bad job list request: " + err.Error()})
	case !n.holdsAllAcks():
		answer(jobListAnswer{Error: "this node is not a trusted writer: it does not hold the acks"})
	default:
		answer(jobListAnswer{Jobs: n.localJobs(tribe)})
	}
}

// localJobs are the jobs of tribe (all if empty) as this node holds them,
// oldest first.
func (n *Node) localJobs(tribe string) []api.Job {
	out := []api.Job{}
	for _, e := range n.replica.Children(jobsPrefix) {
		j, _, err := n.job(e)
		if err == nil && (tribe == "" || slices.Contains(j.Tribes, tribe)) {
			out = append(out, n.listView(e, j))
		}
	}
	slices.SortFunc(out, func(a, b api.Job) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// Why askJobList found no list: no trusted writer is connected, or each
// that is connected speaks an earlier version (no list protocol).
var (
	errNoWriter        = errors.New("no trusted writer is connected")
	errListUnsupported = errors.New("the connected trusted writers do not serve job lists (an earlier version)")
)

// askJobList asks the trusted writers this node is connected to, one
// after another, for their list, and returns the first answer. If none
// answers, the error says why of each.
func (n *Node) askJobList(ctx context.Context, tribe string) ([]api.Job, error) {
	var errs []error
	unsupported := 0
	for _, w := range n.replica.Trust().Peers() {
		if w == n.host.ID() || n.host.Network().Connectedness(w) != network.Connected {
			continue
		}
		list, err := n.fetchJobList(ctx, w, tribe)
		if err == nil {
			return list, nil
		}
		if errors.As(err, &msmux.ErrNotSupported[protocol.ID]{}) {
			unsupported++
		}
		errs = append(errs, fmt.Errorf("asking %s for the job list: %w", w, err))
	}
	switch {
	case len(errs) == 0:
		return nil, errNoWriter
	case unsupported == len(errs):
		return nil, errListUnsupported
	}
	return nil, errors.Join(errs...)
}

func (n *Node) fetchJobList(ctx context.Context, w peer.ID, tribe string) ([]api.Job, error) {
	s, done, err := n.askLine(ctx, w, JobListProtocol, jobListTimeout, struct {
		Tribe string `json:"tribe"`
	}{tribe})
	if err != nil {
		return nil, err
	}
	defer done()
	b, err := io.ReadAll(io.LimitReader(s, jobListAnswerMax+1))
	if err != nil {
		return nil, err
	}
	if len(b) > jobListAnswerMax {
		n.jobs.listBadAnswer.Add(1)
		return nil, fmt.Errorf("an answer over %d MiB", jobListAnswerMax>>20)
	}
	list, err := decodeJobListAnswer(b)
	if errors.Is(err, errNotJobList) {
		n.jobs.listBadAnswer.Add(1)
	}
	return list, err
}

// A job's row in a list (its view without targets) is kept until the job
// or one of its acks changes (the watcher set in initJobs drops it), or
// until the job expires (targets that have not acked are expired from
// then) and until its acks not final are overdue (jobs.Job.Overdue): a list read and decoded every ack of every job, 5 million at
// 5,000 targets and 1,000 jobs, and a trusted writer lists for any
// admitted node that asks. A writer's collection each minute reads the
// job's standing from the same row (jobStanding).
type listView struct {
	hash     [32]byte  // the job entry's
	until    time.Time // zero: nothing left to pass
	view     api.Job
	finished time.Time // when the last target ended (the summary's Finished)
	// unfinal are the targets whose ack is not final, for a job that is
	// pending: what its writer may ask them for (fetchMissingAcks). One
	// no node here was known by when the row was made has its hash only,
	// looked up again at each use: a record that arrives later changes no
	// ack, so it does not drop the row.
	unfinal []jobs.Target
}

// listView is job j's row, from e, kept or made.
func (n *Node) listView(e *gossip.Signed, j *jobs.Job) api.Job {
	return n.keptView(e, j).view
}

// jobStanding is job j's state across its targets and when it finished,
// from e, as its kept row says: what collectJobs needs of it.
func (n *Node) jobStanding(e *gossip.Signed, j *jobs.Job) jobs.Summary {
	v := n.keptView(e, j)
	return jobs.Summary{State: jobs.State(v.view.State), Finished: v.finished}
}

// keptView is job j's row, from e, kept or made.
func (n *Node) keptView(e *gossip.Signed, j *jobs.Job) listView {
	now := n.now()
	s := &n.jobs
	s.mu.Lock()
	v, ok := s.views[j.ID]
	gen := s.viewGens[j.ID]
	s.mu.Unlock()
	if ok && v.hash == e.Hash && (v.until.IsZero() || now.Before(v.until)) {
		return v
	}
	view, sum := n.summarizedView(j, false)
	v = listView{hash: e.Hash, view: view, finished: sum.Finished}
	if sum.State == jobs.Pending {
		for _, t := range sum.Targets {
			if !t.Ack.State.Final() {
				v.unfinal = append(v.unfinal, t)
			}
		}
	}
	// Kept until the clock alone changes it: at the expiry (targets
	// that never acked expire), and once acks not final are overdue.
	switch {
	case now.Before(j.Expires):
		v.until = j.Expires
	case now.Before(j.Overdue()):
		v.until = j.Overdue()
	}
	s.viewsMade.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.viewGens[j.ID] != gen {
		return v // the job or an ack of it changed meanwhile
	}
	if s.views == nil {
		s.views = map[string]listView{}
	}
	s.views[j.ID] = v
	return v
}

// dropView forgets the row of the job whose entry or ack changed at key.
func (s *jobSet) dropView(key string) {
	id, _, _ := strings.Cut(strings.TrimPrefix(key, jobsPrefix), "/")
	s.mu.Lock()
	delete(s.views, id)
	if s.viewGens == nil {
		s.viewGens = map[string]uint64{}
	}
	s.viewGens[id]++
	s.mu.Unlock()
}

// pruneViews forgets the rows of jobs not in live (collectJobs).
func (s *jobSet) pruneViews(live map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	maps.DeleteFunc(s.views, func(id string, _ listView) bool { return !live[id] })
	maps.DeleteFunc(s.viewGens, func(id string, _ uint64) bool { return !live[id] })
}
