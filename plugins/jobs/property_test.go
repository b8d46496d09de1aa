package jobs

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
)

var schedules = flag.Int("jobs.schedules", 200, "seeded schedules of partitions, crashes and restarts in TestJobsSurviveSchedules")

// The model: a few nodes, each with the real replicated state
// (gossip.State, signed entries, the authorisation table) standing for
// its store, and the real Runner standing for its job loop. The network
// is anti-entropy between nodes that are up and on the same side of a
// partition. A crash loses the runs in flight (and the Runner: what
// the process knew) but keeps the state, as the bbolt store does. A run's
// effect happens when it completes, so a run a crash cut short had none.
type model struct {
	t     *testing.T
	rng   *rand.Rand
	now   time.Time
	nodes []*mnode
	jobs  []*Job // as submitted
	queue int
}

type mnode struct {
	m      *model
	i      int
	key    crypto.PrivKey
	id     peer.ID
	st     *gossip.State
	clock  gossip.HLC
	up     bool
	side   int
	runner *Runner
	flying []Run
	// effects counts completed runs by job; starts is the order runs of
	// queued jobs started in; crashed says a crash cut a run of the job.
	effects map[string]int
	starts  []*Job
	crashed map[string]bool
}

func (n *mnode) Self() string   { return n.id.String() }
func (n *mnode) Now() time.Time { return n.m.now }

func (n *mnode) Jobs() []*Job {
	var out []*Job
	for _, e := range n.st.Prefix("jobs/") {
		if strings.Count(e.Key, "/") != 1 {
			continue
		}
		j, err := Decode(e.Value)
		if err != nil {
			n.m.t.Fatalf("node %d holds an unreadable job: %v", n.i, err)
		}
		out = append(out, &j)
	}
	return out
}

func (n *mnode) Known(id string) bool {
	_, ok := n.st.Version("jobs/" + id)
	return ok
}

func (n *mnode) Acks() map[string]Ack {
	out := map[string]Ack{}
	suffix := "/acks/" + n.id.String()
	for _, e := range n.st.Prefix("jobs/") {
		if id, ok := strings.CutSuffix(strings.TrimPrefix(e.Key, "jobs/"), suffix); ok {
			a, err := DecodeAck(e.Value)
			if err != nil {
				n.m.t.Fatalf("node %d holds an unreadable ack: %v", n.i, err)
			}
			out[id] = a
		}
	}
	return out
}

func (n *mnode) Member(string) bool { return n.i != 0 }

func (n *mnode) PutAck(id string, a Ack) error {
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	return n.write("jobs/"+id+"/acks/"+n.id.String(), b)
}

func (n *mnode) write(key string, value []byte) error {
	n.clock = gossip.Next(n.clock, n.m.now)
	s, err := gossip.Sign(gossip.Entry{Key: key, Value: value, HLC: n.clock}, n.key)
	if err != nil {
		return err
	}
	_, err = n.st.Apply(s, n.m.now)
	return err
}

// pull applies everything src holds that n lacks (anti-entropy).
func (n *mnode) pull(src *mnode) {
	if n.st.Root() == src.st.Root() {
		return
	}
	for _, e := range src.st.Prefix("") {
		n.apply(e)
	}
}

func (n *mnode) apply(e *gossip.Signed) {
	if _, err := n.st.Apply(e, n.m.now); err != nil {
		n.m.t.Fatalf("node %d refused entry %s: %v", n.i, e.Key, err)
	}
	n.clock = gossip.Observe(n.clock, e.HLC)
}

// step runs the node's job loop once.
func (n *mnode) step() {
	runs, _, err := n.runner.Step(n)
	if err != nil {
		n.m.t.Fatal(err)
	}
	for _, r := range runs {
		if !r.Job.Parallel {
			n.starts = append(n.starts, r.Job)
		}
	}
	n.flying = append(n.flying, runs...)
}

// complete finishes the runs in flight, each with probability p.
func (n *mnode) complete(p float64) {
	var left []Run
	for _, r := range n.flying {
		if n.m.rng.Float64() >= p {
			left = append(left, r)
			continue
		}
		n.effects[r.Job.ID]++
		if err := n.runner.Finish(n, r, Result{OK: true, Output: []byte(`"ok"`)}); err != nil {
			n.m.t.Fatal(err)
		}
	}
	n.flying = left
}

func (n *mnode) crash() {
	for _, r := range n.flying {
		n.crashed[r.Job.ID] = true
	}
	n.flying, n.runner, n.up = nil, nil, false
}

func (n *mnode) start() { n.up, n.runner = true, &Runner{MaxQueue: n.m.queue} }

// submit writes a job from node 0 (the trusted writer) to every other
// node, after the last job of the queue node 0 knows.
func (m *model) submit() {
	w := m.nodes[0]
	var last *Job
	for _, j := range w.Jobs() {
		if last == nil || order(j, last) > 0 {
			last = j
		}
	}
	j := &Job{ID: fmt.Sprintf("j%d", len(m.jobs)), Tribes: []string{"web"}, Plugin: "exec", Method: "run",
		Created: m.now, Expires: m.now.Add(time.Duration(20+m.rng.IntN(400)) * time.Second),
		Retries: m.rng.IntN(3), Parallel: m.rng.IntN(8) == 0}
	if last != nil {
		j.After, j.Seq = last.ID, last.Seq+1
	}
	var ids []string
	for _, n := range m.nodes[1:] {
		ids = append(ids, n.id.String())
	}
	j.SetTargets(ids)
	b, _ := json.Marshal(j)
	if err := w.write("jobs/"+j.ID, b); err != nil {
		m.t.Fatal(err)
	}
	m.jobs = append(m.jobs, j)
}

func newModel(t *testing.T, seed uint64) *model {
	m := &model{t: t, rng: rand.New(rand.NewPCG(seed, seed)), now: t0, queue: 3 + int(seed%5)*4}
	n := 3 + m.rng.IntN(3)
	var trusted peer.ID
	for i := range n {
		k, _, err := crypto.GenerateEd25519Key(seededReader{m.rng})
		if err != nil {
			t.Fatal(err)
		}
		id, _ := peer.IDFromPrivateKey(k)
		if i == 0 {
			trusted = id
		}
		node := &mnode{m: m, i: i, key: k, id: id, effects: map[string]int{}, crashed: map[string]bool{}}
		m.nodes = append(m.nodes, node)
	}
	for _, node := range m.nodes {
		node.st = gossip.NewState(gossip.NewTrust(trusted))
		node.start()
	}
	return m
}

type seededReader struct{ rng *rand.Rand }

func (s seededReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(s.rng.Uint32())
	}
	return len(p), nil
}

// run plays steps random events, then heals everything and lets the fleet
// settle.
func (m *model) run(steps int) {
	for range steps {
		switch r := m.rng.IntN(100); {
		case r < 8:
			if m.nodes[0].up {
				m.submit()
			}
		case r < 25: // pubsub: one entry, so a later job may arrive first
			a, b := m.nodes[m.rng.IntN(len(m.nodes))], m.nodes[m.rng.IntN(len(m.nodes))]
			if a.up && b.up && a.side == b.side {
				if es := a.st.Prefix(""); len(es) > 0 {
					b.apply(es[m.rng.IntN(len(es))])
				}
			}
		case r < 40: // anti-entropy between two nodes that can reach each other
			a, b := m.nodes[m.rng.IntN(len(m.nodes))], m.nodes[m.rng.IntN(len(m.nodes))]
			if a.up && b.up && a.side == b.side {
				a.pull(b)
				b.pull(a)
			}
		case r < 70:
			if n := m.nodes[m.rng.IntN(len(m.nodes))]; n.up {
				n.complete(0.5)
				n.step()
			}
		case r < 76:
			if n := m.nodes[1+m.rng.IntN(len(m.nodes)-1)]; n.up {
				n.crash()
			}
		case r < 84:
			if n := m.nodes[m.rng.IntN(len(m.nodes))]; !n.up {
				n.start()
			}
		case r < 88:
			for _, n := range m.nodes {
				n.side = m.rng.IntN(2)
			}
		case r < 92:
			for _, n := range m.nodes {
				n.side = 0
			}
		default:
			m.now = m.now.Add(time.Duration(m.rng.IntN(4000)) * time.Millisecond)
		}
	}
	for _, n := range m.nodes {
		n.side = 0
		if !n.up {
			n.start()
		}
	}
	for range 500 {
		if m.settled() {
			return
		}
		for _, a := range m.nodes {
			for _, b := range m.nodes {
				a.pull(b)
			}
		}
		for _, n := range m.nodes {
			n.complete(1)
			n.step()
		}
		m.now = m.now.Add(time.Second)
	}
}

// settled reports whether every target has ended every job.
func (m *model) settled() bool {
	for _, n := range m.nodes[1:] {
		acks := n.Acks()
		for _, j := range m.jobs {
			if !acks[j.ID].State.Final() {
				return false
			}
		}
	}
	return true
}

// check holds the model to the promises of durable jobs.
func (m *model) check() {
	t := m.t
	for _, n := range m.nodes[1:] {
		acks := n.Acks()
		for _, j := range m.jobs {
			a, ok := acks[j.ID]
			runs := n.effects[j.ID]
			switch {
			case runs > 1:
				t.Fatalf("node %d ran %s %d times", n.i, j.ID, runs)
			case !ok:
				t.Fatalf("node %d never acked %s", n.i, j.ID)
			case !a.State.Final():
				t.Fatalf("node %d left %s %s after the fleet settled", n.i, j.ID, a.State)
			case a.State == Done && runs != 1:
				t.Fatalf("node %d says %s done but ran it %d times", n.i, j.ID, runs)
			case a.State != Done && runs != 0:
				t.Fatalf("node %d says %s %s but ran it", n.i, j.ID, a.State)
			case a.State == Interrupted && !n.crashed[j.ID]:
				t.Fatalf("node %d says %s interrupted but no crash cut it", n.i, j.ID)
			case a.State == Expired && a.Ended.Before(j.Expires):
				t.Fatalf("node %d expired %s before its expiry", n.i, j.ID)
			case a.State == Failed || a.State == Cancelled:
				t.Fatalf("node %d: %s %s, but nothing fails or cancels here", n.i, j.ID, a.State)
			case a.State == Interrupted && a.Attempts <= j.Retries && a.Ended.Before(j.Expires):
				t.Fatalf("node %d gave up %s after %d attempts of %d", n.i, j.ID, a.Attempts, j.Retries+1)
			}
		}
		for i := 1; i < len(n.starts); i++ {
			if a, b := n.starts[i-1], n.starts[i]; order(a, b) > 0 {
				t.Fatalf("node %d started %s (seq %d) after %s (seq %d)", n.i, b.ID, b.Seq, a.ID, a.Seq)
			}
		}
	}
}

func TestJobsSurviveSchedules(t *testing.T) {
	done, interrupted, expired, dropped := 0, 0, 0, 0
	for seed := range uint64(*schedules) {
		m := newModel(t, seed)
		func() {
			defer func() {
				if t.Failed() {
					t.Logf("in the schedule of seed %d (newModel(t, %d) replays it)", seed, seed)
				}
			}()
			m.run(300)
			m.check()
		}()
		for _, n := range m.nodes[1:] {
			for _, a := range n.Acks() {
				switch a.State {
				case Done:
					done++
				case Interrupted:
					interrupted++
				case Expired:
					expired++
				case Dropped:
					dropped++
				}
			}
		}
	}
	t.Logf("%d schedules: %d done, %d interrupted, %d expired, %d dropped", *schedules, done, interrupted, expired, dropped)
	// The schedules must reach every outcome, or they test less than they
	// claim.
	if done == 0 || interrupted == 0 || expired == 0 || dropped == 0 {
		t.Fatalf("the schedules never reached some outcome: %d done, %d interrupted, %d expired, %d dropped", done, interrupted, expired, dropped)
	}
}
