package node

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip/authority"
	"github.com/tribeagent/tribe/gossip/swim"
	"github.com/tribeagent/tribe/node/api/metrics"
	"github.com/tribeagent/tribe/plugins"
)

// ErrNotRunning is the health check's answer for a node that is not
// started or already closed.
var ErrNotRunning = errors.New("node: not running")

// metricsSource is the node as node/api/metrics reads it: at scrape time,
// from memory.
type metricsSource struct{ n *Node }

var (
	_ metrics.Source  = metricsSource{}
	_ metrics.Checker = metricsSource{}
)

// servedOption feeds m's call histogram from the call server.
func servedOption(m *metrics.Metrics) plugins.ServerOption {
	return plugins.WithServed(func(plugin string, code plugins.Code, d time.Duration) {
		m.Served(plugin, string(code), d)
	})
}

// observeCall records one target's answer to a call this node made.
func (n *Node) observeCall(r plugins.Response, d time.Duration) {
	if n.metrics == nil {
		return
	}
	code := r.Code
	switch {
	case r.OK:
		code = ""
	case !code.Known():
		code = "other"
	}
	n.metrics.Called(string(code), d)
}

// Snapshot implements metrics.Source. Every label value the node can
// report is present, at zero if need be, so that alerts on a rate or a
// ratio find the series.
func (s metricsSource) Snapshot() metrics.Snapshot {
	n := s.n
	snap := metrics.Snapshot{
		ID: n.host.ID().String(), Name: n.cfg.Name, Cluster: n.cfg.Cluster, Version: Version,
		Peers:            len(n.ConnectedPeers()),
		Entries:          n.replica.Len(),
		StoreCommits:     n.replica.StoreCommits(),
		NodesByLiveness:  map[string]int{Alive: 0, Suspect: 0, Dead: 0},
		NodesByAdmission: map[string]int{},
		Rejected:         n.rejected(),
		Dropped:          n.drops.Counts(),
		Plugins:          map[string]int{"loaded": 0, "error": 0},
	}
	traffic, dups := n.traffic.Counts()
	snap.Pubsub = metrics.Pubsub{Sent: traffic["sent"], Received: traffic["received"], Duplicates: dups}
	if n.swim.d != nil {
		st := n.swim.d.Stats()
		snap.ProbeHealth, snap.ProbesLate = st.Health, st.Late
		snap.Probes = map[string]int64{"ack": st.Acked, "indirect": st.Indirect, "failed": st.Failed}
		c := st.Counts
		snap.Claims = map[string]int64{"alive": c.Applied[swim.Alive], "suspect": c.Applied[swim.Suspect],
			"dead": c.Applied[swim.Dead], "left": c.Applied[swim.Left], "confirm": c.Confirmations}
		snap.Refutations = c.Refuted
	}
	rules := n.rules()
	if n.replica.Trust().Open() {
		snap.NodesByAdmission[string(authority.Open)] = 0
	} else {
		for _, st := range []authority.Status{authority.Trusted, authority.Admitted, authority.Pending, authority.Revoked} {
			snap.NodesByAdmission[string(st)] = 0
		}
	}
	// By key, not by record: decoding 5,000 records' facts per scrape
	// would cost more than the scrape is worth.
	for _, e := range n.replica.Prefix(nodesPrefix) {
		id, err := peer.Decode(strings.TrimPrefix(e.Key, nodesPrefix))
		if err != nil {
			continue
		}
		snap.NodesByLiveness[n.liveness(id)]++
		snap.NodesByAdmission[string(rules.Status(id))]++
	}
	t := n.replica.SyncTotals()
	snap.Sync = metrics.Sync{Pulls: t.Pulls, Failed: t.Failed, Rounds: t.Rounds, BytesSent: t.Sent, BytesRecv: t.Recv,
		Fetched: t.Fetched, Applied: t.Applied, Shared: t.Shared, Relayed: t.Relayed, Relinks: n.relinks.Load(), JoinRedials: n.joinRedials.Load()}
	snap.CallDialRetries = n.callDialRetries.Load()
	snap.CallsRelayed, snap.CallsRelayedAgain = n.callsRelayed.Load(), n.callsRelayedAgain.Load()
	if n.relay != nil {
		snap.OrdersRun, snap.OrdersAnsweredAgain = n.relay.Ran(), n.relay.AnsweredAgain()
	}
	n.plugins.mu.Lock()
	for _, l := range n.plugins.loaded {
		if l.err != nil {
			snap.Plugins["error"]++
		} else {
			snap.Plugins["loaded"]++
		}
	}
	n.plugins.mu.Unlock()
	return snap
}

// Health implements metrics.Checker: the node runs and its state store
// answers.
func (s metricsSource) Health(ctx context.Context) (metrics.Health, error) {
	n := s.n
	if n.ctx == nil || n.ctx.Err() != nil {
		return metrics.Health{}, ErrNotRunning
	}
	if err := n.store.Check(); err != nil {
		return metrics.Health{}, err
	}
	if err := ctx.Err(); err != nil {
		return metrics.Health{}, err
	}
	return metrics.Health{ID: n.host.ID().String(), Name: n.cfg.Name, Peers: len(n.ConnectedPeers()),
		Entries: n.replica.Len(), Uptime: n.now().Sub(n.started).Seconds()}, nil
}
