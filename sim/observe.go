package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
)

// pollEvery is how often WaitFor checks its condition, per 100 nodes: a
// condition is usually a look at every node, N² work a second at a fixed
// rate, and in simulated time the clock stands still while it runs.
const pollEvery = 50 * time.Millisecond

// poll is how often this simulation checks a condition.
func (s *Sim) poll() time.Duration { return pollEvery * time.Duration(max(1, len(s.members)/100)) }

// ErrTimeout is returned by WaitFor when the condition did not hold in time.
var ErrTimeout = fmt.Errorf("sim: condition not met in time")

// WaitFor checks cond until it holds, timeout passes or ctx ends. It returns
// how long the condition took to hold.
func (s *Sim) WaitFor(ctx context.Context, timeout time.Duration, cond func() bool) (time.Duration, error) {
	start := time.Now()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(s.poll())
	defer tick.Stop()
	for {
		if cond() {
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-deadline.C:
			return time.Since(start), fmt.Errorf("%w (%v)", ErrTimeout, timeout)
		case <-tick.C:
		}
	}
}

// ErrStalled is returned by WaitProgress when progress stopped rising.
var ErrStalled = fmt.Errorf("sim: no progress")

// WaitProgress waits until done holds, and fails only if progress (a count
// that rises as the cluster gets there: nodes with enough peers, say) has
// not risen for stall, or ctx ends. A busy machine slows a simulation
// without stopping it: a fixed deadline failed such runs (a 100-node
// cluster reached 3 peers each in 2 m 52 s against 2 minutes), a stall
// does not. It returns how long done took to hold.
func (s *Sim) WaitProgress(ctx context.Context, stall time.Duration, progress func() int, done func() bool) (time.Duration, error) {
	start := time.Now()
	best, since := progress(), start
	tick := time.NewTicker(s.poll())
	defer tick.Stop()
	for {
		if done() {
			return time.Since(start), nil
		}
		if p := progress(); p > best {
			best, since = p, time.Now()
		} else if time.Since(since) > stall {
			return time.Since(start), fmt.Errorf("%w for %v (progress %d)", ErrStalled, stall, best)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-tick.C:
		}
	}
}

// NodesWithPeers counts the running nodes with at least k peers.
func (s *Sim) NodesWithPeers(k int) int {
	count := 0
	for i := range s.members {
		if s.Node(i) != nil && len(s.Peers(i)) >= k {
			count++
		}
	}
	return count
}

// Holds checks cond for the whole of d and fails at the first check it does
// not hold: the way to assert that something stays true (a partition stays
// closed while nodes keep redialling), where WaitFor asserts that it becomes
// true.
func (s *Sim) Holds(ctx context.Context, d time.Duration, cond func() bool) error {
	end := time.Now().Add(d)
	tick := time.NewTicker(s.poll())
	defer tick.Stop()
	for time.Now().Before(end) {
		if !cond() {
			return fmt.Errorf("sim: condition broke after %v", d-time.Until(end))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// Peers returns the cluster peers node i is connected to (nil if crashed).
func (s *Sim) Peers(i int) []peer.ID {
	if n := s.Node(i); n != nil {
		return n.ConnectedPeers()
	}
	return nil
}

// MinPeers is the smallest peer count over the running nodes.
func (s *Sim) MinPeers() int {
	least := -1
	for i := range s.members {
		if s.Node(i) == nil {
			continue
		}
		if k := len(s.Peers(i)); least < 0 || k < least {
			least = k
		}
	}
	return least
}

// index maps peer IDs to node indices.
func (s *Sim) index() map[peer.ID]int {
	idx := make(map[peer.ID]int, len(s.members))
	for i, m := range s.members {
		idx[m.id] = i
	}
	return idx
}

// CrossConnections counts connections between a node of a and a node of b,
// as seen from the nodes of a at the libp2p level (hello or not).
func (s *Sim) CrossConnections(a, b []int) int {
	inB := map[peer.ID]bool{}
	for _, j := range b {
		inB[s.members[j].id] = true
	}
	count := 0
	for _, i := range a {
		n := s.Node(i)
		if n == nil {
			continue
		}
		for _, p := range n.Host().Network().Peers() {
			if inB[p] {
				count++
			}
		}
	}
	return count
}

// Components is the number of connected components of the running nodes'
// connection graph: 1 when every node can reach every other.
func (s *Sim) Components() int {
	idx := s.index()
	seen := make([]bool, len(s.members))
	comps := 0
	for start := range s.members {
		if seen[start] || s.Node(start) == nil {
			continue
		}
		comps++
		stack := []int{start}
		seen[start] = true
		for len(stack) > 0 {
			i := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for _, p := range s.Peers(i) {
				if j, ok := idx[p]; ok && !seen[j] && s.Node(j) != nil {
					seen[j] = true
					stack = append(stack, j)
				}
			}
		}
	}
	return comps
}

// Converged reports whether every running node holds the same state.
func (s *Sim) Converged() bool {
	var first [32]byte
	seen := false
	for i := range s.members {
		n := s.Node(i)
		if n == nil {
			continue
		}
		h := n.Replica().Hash()
		if seen && h != first {
			return false
		}
		first, seen = h, true
	}
	return true
}

// Mocknet is the simulator's mock network, for tests that bring their own
// hosts (a rogue peer, say). On SimNet it holds no nodes.
func (s *Sim) Mocknet() mocknet.Mocknet { return s.mn }

// Dropped sums, over the running nodes, the message copies pubsub dropped
// under load, by queue.
func (s *Sim) Dropped() map[string]int64 {
	sum := map[string]int64{}
	for i := range s.members {
		if n := s.Node(i); n != nil {
			for q, c := range n.Dropped() {
				sum[q] += c
			}
		}
	}
	return sum
}
