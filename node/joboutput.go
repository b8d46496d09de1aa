package node

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/internal/strictjson"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins/jobs"
)

// JobOutputProtocol serves a target's whole output of a job (`tribe job
// output`): the request is one line {"job": "<id>"}, the answer one line
// {"output": "<bytes>"} or {"error": "..."}. Only trusted writers may ask.
const JobOutputProtocol = "/tribe/job-output/1.0.0"

const (
	// jobOutputRequestMax bounds a request line.
	jobOutputRequestMax = 256
	// maxOutputServing bounds the outputs a target sends at once, one
	// per peer.
	maxOutputServing = 4
)

// decodeJobOutputRequest reads a request line, refusing anything else.
func decodeJobOutputRequest(line []byte) (string, error) {
	var req struct {
		Job string `json:"job"`
	}
	if err := strictjson.Decode(line, &req); err != nil {
		return "", fmt.Errorf("not an output request: %w", err)
	}
	if !gossip.ValidName(req.Job) {
		return "", fmt.Errorf("job %q is not a job id", req.Job)
	}
	return req.Job, nil
}

type jobOutputAnswer struct {
	Output []byte `json:"output,omitempty"`
	Error  string `json:"error,omitempty"`
}

// serveJobOutput is a target's side. Whom it refuses, it refuses before
// it reads the request or takes a slot: a stranger's stream costs nothing
// and holds no place a writer needs.
func (n *Node) serveJobOutput(s network.Stream) {
	defer s.Close()
	s.SetDeadline(time.Now().Add(requestTimeout))
	answer := func(a jobOutputAnswer) { json.NewEncoder(s).Encode(a) }
	from := s.Conn().RemotePeer()
	if !n.replica.Trust().Trusted(from) {
		n.jobs.outputRefused.Add(1)
		answer(jobOutputAnswer{Error: fmt.Sprintf("%s is not a trusted writer: only trusted writers read job outputs", from)})
		return
	}
	// Each answer reads up to a MiB from disk and holds it while it is
	// sent: a few at once, one per peer.
	if n.replica.Penalised(from) || !n.jobs.outputs.Acquire(from) {
		n.jobs.outputRefused.Add(1)
		answer(jobOutputAnswer{Error: "busy: serving other outputs (or one to this node already); try again"})
		return
	}
	defer n.jobs.outputs.Release(from)
	line, err := readFirstRequest(s, jobOutputRequestMax)
	var id string
	if err == nil {
		id, err = decodeJobOutputRequest(line)
	}
	if err != nil {
		n.jobs.outputRefused.Add(1)
		answer(jobOutputAnswer{Error: "bad output request: " + err.Error()})
		return
	}
	out, err := n.readJobOutput(id)
	if err != nil {
		answer(jobOutputAnswer{Error: err.Error()})
		return
	}
	s.SetWriteDeadline(time.Now().Add(watchWriteTimeout))
	answer(jobOutputAnswer{Output: out})
}

// readJobOutput is this node's kept output of job id.
func (n *Node) readJobOutput(id string) ([]byte, error) {
	a, ok := n.ownAck(id)
	switch {
	case !ok:
		return nil, fmt.Errorf("job %s has not run on this node", id)
	case a.OutputBytes == 0:
		return nil, fmt.Errorf("job %s ran here (%s) with no output", id, a.State)
	}
	if jobs.HeadHoldsAll([]byte(a.OutputHead)) && a.OutputBytes == len(a.OutputHead) {
		return []byte(a.OutputHead), nil // the whole output is in the ack, not kept apart
	}
	out, err := os.ReadFile(n.jobOutputPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("job %s's output is no longer kept on this node", id)
	}
	return out, err
}

// JobOutput implements api.Agent: node's kept output of job id, this
// node's from its file, another's over JobOutputProtocol, checked against
// the digest in that node's signed ack.
func (n *Node) JobOutput(ctx context.Context, id, node string) (api.JobOutput, error) {
	j, _, err := n.jobByID(ctx, id)
	if err != nil {
		return api.JobOutput{}, err
	}
	ids, err := n.resolve([]string{node})
	if err != nil {
		return api.JobOutput{}, err
	}
	target := ids[0]
	rec, _ := n.nodeNamed(target)
	e, ok := n.replica.Get(ackKey(id, target))
	if !ok { // acks go to the job's writer
		n.askJobWriter(ctx, j)
		e, ok = n.replica.Get(ackKey(id, target))
	}
	if !ok {
		return api.JobOutput{}, api.BadRequest(fmt.Errorf("%s has not acknowledged job %s", node, id))
	}
	a, err := jobs.DecodeAck(e.Value)
	if err != nil {
		return api.JobOutput{}, fmt.Errorf("%s's ack of job %s: %w", node, id, err)
	}
	if a.OutputBytes == 0 {
		return api.JobOutput{Job: id, ID: target.String(), Name: rec.Name}, nil
	}
	var out []byte
	if target == n.host.ID() {
		out, err = n.readJobOutput(id)
	} else {
		out, err = n.fetchJobOutput(ctx, target, rec.Addrs, id)
	}
	if err != nil {
		return api.JobOutput{}, fmt.Errorf("output of job %s on %s: %w", id, node, err)
	}
	sum := sha256.Sum256(out)
	if digest := hex.EncodeToString(sum[:]); digest != a.OutputDigest || len(out) != a.OutputBytes {
		return api.JobOutput{}, fmt.Errorf("output of job %s on %s does not match its ack (%d bytes, sha256 %s; the ack says %d, %s)",
			id, node, len(out), digest, a.OutputBytes, a.OutputDigest)
	}
	return api.JobOutput{Job: id, ID: target.String(), Name: rec.Name, Bytes: len(out), Digest: a.OutputDigest, Output: string(out)}, nil
}

func (n *Node) fetchJobOutput(ctx context.Context, p peer.ID, addrs []string, id string) ([]byte, error) {
	if n.host.Network().Connectedness(p) != network.Connected {
		n.learnAddrs(p, addrs)
	}
	s, done, err := n.askLine(ctx, p, JobOutputProtocol, 30*time.Second, struct {
		Job string `json:"job"`
	}{id})
	if err != nil {
		return nil, err
	}
	defer done()
	out, err := decodeJobOutputAnswer(s)
	if errors.Is(err, errBadOutputAnswer) {
		n.jobs.outputBadAnswer.Add(1)
	}
	return out, err
}

// errBadOutputAnswer is a job output answer that does not read.
var errBadOutputAnswer = errors.New("a job output answer that does not read")

// decodeJobOutputAnswer reads a target's answer to a job output request:
// the output, or the target's refusal as an error.
func decodeJobOutputAnswer(r io.Reader) ([]byte, error) {
	// base64 of the largest output, and the JSON around it.
	var a jobOutputAnswer
	if err := json.NewDecoder(io.LimitReader(r, jobOutputMax/3*4+1024)).Decode(&a); err != nil {
		return nil, fmt.Errorf("%w: %v", errBadOutputAnswer, err)
	}
	if a.Error != "" {
		return nil, errors.New(a.Error)
	}
	if len(a.Output) > jobOutputMax {
		return nil, fmt.Errorf("%w: %d bytes of output, at most %d", errBadOutputAnswer, len(a.Output), jobOutputMax)
	}
	return a.Output, nil
}

// readFirstRequest reads s's request line, of at most max bytes, and
// resets s if the line has not come whole within firstRequestTimeout. A
// timer rather than a read deadline, as gossip's sync server has: some
// transports (mocknet's, which the simulator runs on) ignore deadlines.
func readFirstRequest(s network.Stream, max int) ([]byte, error) {
	late := time.AfterFunc(firstRequestTimeout, func() { s.Reset() })
	defer late.Stop()
	return bufio.NewReaderSize(s, max).ReadSlice('\n')
}

// askLine opens a stream of proto to p and sends req as one JSON line, for
// the caller to read the answer from s, within timeout (then s is reset);
// done closes it.
func (n *Node) askLine(ctx context.Context, p peer.ID, proto protocol.ID, timeout time.Duration, req any) (s network.Stream, done func(), err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	s, err = n.host.NewStream(ctx, p, proto)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	done = func() {
		stop()
		s.Close()
		cancel()
	}
	if err := json.NewEncoder(s).Encode(req); err != nil {
		done()
		return nil, nil, err
	}
	return s, done, nil
}
