// Package metrics is the agent's Prometheus endpoint and health check,
// served on an opt-in TCP address (`tribe agent --metrics-addr`), apart
// from the private control socket so that a scraper or a load balancer
// can reach it:
//
//	GET /metrics  the text exposition format (or whatever the scraper
//	              negotiates through promhttp)
//	GET /healthz  200 and {"status":"ok","peers":N,...} while the node runs
//	              and its state store answers; 503 and the reason otherwise
//
// Drive it as New(src) (one registry: the agent's collector, Go's runtime
// and the process), then Handler(checker) on Listen(addr, ...), Shutdown
// at the end. The node implements Source and Checker and feeds Served
// from its call server.
//
// Counters and gauges are read from Source when a scrape asks for them:
// nothing polls in the background, and an agent nobody scrapes spends
// nothing on them. Only the served-call histogram is fed as calls end.
package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Source is the agent as a scrape sees it. Snapshot is called once per
// scrape, concurrently with everything the agent does, so it must be safe
// for concurrent use; it reads in-memory state and must not block on the
// network or the disk.
type Source interface {
	Snapshot() Snapshot
}

// Checker tells a load balancer whether to send work here. Health returns
// nil when the node runs and its state store answers, with a few figures
// for the answer's body; an error says what is wrong. It is called for
// every GET /healthz, concurrently, and must honour ctx.
type Checker interface {
	Health(ctx context.Context) (Health, error)
}

// Health is the body of a healthy /healthz answer (Status is set by the
// handler).
type Health struct {
	Status  string  `json:"status"`
	ID      string  `json:"id"`
	Name    string  `json:"name"`
	Peers   int     `json:"peers"`
	Entries int     `json:"entries"`
	Uptime  float64 `json:"uptime_s"`
}

// Snapshot is what the agent counts, read at one moment. Maps are by
// label value; a value the source leaves out is not exported, so a source
// that wants a series to exist at zero (alerts on "absent" are fragile)
// puts it in with 0.
type Snapshot struct {
	// Info labels tribe_info: who this agent is.
	ID, Name, Cluster, Version string
	// Peers is the connected peers of this cluster.
	Peers int
	// ProbeHealth is the failure detector's local health score.
	ProbeHealth int
	// ProbesLate is the failed probes the failure detector saw end late
	// and held against this node, not their target.
	ProbesLate int64
	// Probes is the failure detector's other probes by outcome (ack,
	// indirect, failed); Claims the claims that changed its belief, by
	// claim (alive, suspect, dead, left, confirm); Refutations the
	// claims about this node it refuted.
	Probes      map[string]int64
	Claims      map[string]int64
	Refutations int64
	// Entries is the state keys held, tombstones included.
	Entries int
	// StoreCommits is the state store's write transactions, each a disk
	// sync.
	StoreCommits int64
	// NodesByLiveness counts the nodes with a record (alive, suspect,
	// dead); NodesByAdmission the same nodes by admission (open, trusted,
	// admitted, pending, revoked).
	NodesByLiveness  map[string]int
	NodesByAdmission map[string]int
	// Rejected is refused input by reason (as in `tribe status`), calls
	// refused by the call server as call_<code> included.
	Rejected map[string]int64
	// Dropped is the message copies pubsub dropped, by queue.
	Dropped map[string]int64
	// Pubsub is what pubsub sent and received.
	Pubsub Pubsub
	// Sync adds up the anti-entropy pulls this node made.
	Sync Sync
	// Plugins counts this node's (tribe, plugin) instances by state:
	// loaded or error.
	Plugins map[string]int
	// CallDialRetries is calls made again, within their deadline,
	// because their dial timed out.
	CallDialRetries int64
	// CallsRelayed is targets of this node's fan-outs answered through a
	// relay; CallsRelayedAgain those a relay did not hand the call to,
	// sent to them directly after.
	CallsRelayed, CallsRelayedAgain int64
	// OrdersRun is the orders this node ran; OrdersAnsweredAgain those
	// that came again (their answer lost on the way), answered with the
	// answer it kept.
	OrdersRun, OrdersAnsweredAgain int64
}

// Pubsub is what pubsub sent and received, by part (rpc, message, ihave,
// iwant, graft, prune, idontwant), and the copies of entries it received
// again.
type Pubsub struct {
	Sent, Received map[string]int64
	Duplicates     int64
}

// Sync is the totals of anti-entropy pulls: how many were made and how
// many failed, their rounds, bytes each way and entries fetched, applied
// and left to another pull fetching them; and links to restarted peers
// started over (see relink).
type Sync struct {
	Pulls, Failed, Rounds, BytesSent, BytesRecv, Fetched, Applied int64
	Shared, Relinks                                               int64
	// JoinRedials is --join connections closed and dialled again for
	// want of a hello.
	JoinRedials int64
	// Relayed is pulled entries passed on: a joining peer's fresh ones.
	Relayed int64
}

// ServedBuckets are the bounds, in seconds, of the served-call histogram:
// from an echo on loopback (~0.2 ms) to an exec that runs for minutes.
var ServedBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

// Metrics is the agent's registry. Its methods are safe for concurrent use.
type Metrics struct {
	reg    *prometheus.Registry
	served *prometheus.HistogramVec
	called *prometheus.HistogramVec
}

// New builds the registry: the collector over src, Go's runtime
// collector and the process collector (CPU, RSS, open files).
func New(src Source) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		served: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tribe_call_served_duration_seconds",
			Help:    "Plugin calls this node ran, by plugin and outcome (ok or the failure's code), and how long they took. Calls refused before running are in tribe_rejected_total as call_<code>.",
			Buckets: ServedBuckets,
		}, []string{"plugin", "code"}),
		called: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tribe_call_duration_seconds",
			Help:    "Calls this node made (tribe call), one per target: from the start of the fan-out to that target's answer, by outcome (ok or the failure's code: timeout, gone, unreachable, unauthorized, ...).",
			Buckets: ServedBuckets,
		}, []string{"code"}),
	}
	m.reg.MustRegister(newCollector(src), m.served, m.called,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is where other collectors go (libp2p's, say).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Served records a call this node ran: plugin must be a plugin loaded
// here (never a name a caller sent unchecked: each name is a series),
// code is empty for an answer that is ok.
func (m *Metrics) Served(plugin, code string, d time.Duration) {
	if code == "" {
		code = "ok"
	}
	m.served.WithLabelValues(plugin, code).Observe(d.Seconds())
}

// Called records one target's answer to a call this node made: code is
// empty for ok, else one of a small known set (the node maps codes it
// does not know to "other": a callee chooses them).
func (m *Metrics) Called(code string, d time.Duration) {
	if code == "" {
		code = "ok"
	}
	m.called.WithLabelValues(code).Observe(d.Seconds())
}
