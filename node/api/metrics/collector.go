package metrics

import "github.com/prometheus/client_golang/prometheus"

// The agent's metrics read at scrape time. Names follow Prometheus'
// conventions: counters end in _total, units are base units.
var (
	descInfo = prometheus.NewDesc("tribe_info",
		"This agent: its peer ID, name, cluster and version (always 1).",
		[]string{"id", "name", "cluster", "version"}, nil)
	descPeers = prometheus.NewDesc("tribe_peers",
		"Connected peers of this cluster (they answered hello).", nil, nil)
	descHealth = prometheus.NewDesc("tribe_swim_health",
		"The failure detector's local health score (Lifeguard): 0 while this node's own probes get their answers in time; higher when it misses them (CPU starved, network congested) or they come slowly (a busy fleet), and its probes slow down by that many times plus one.", nil, nil)
	descProbesLate = prometheus.NewDesc("tribe_swim_probes_late_total",
		"Failed probes this node saw end late, its own timers run more than a fifth of the probe timeout after their time (the process was not running: CPU starved or stopped), held against its own health score rather than their target.", nil, nil)
	descProbes = prometheus.NewDesc("tribe_swim_probes_total",
		"The failure detector's probes by outcome: ack (the target answered, or said it was too busy to), indirect (it answered a helper), failed (no one heard it: it is suspect here). Late ones are tribe_swim_probes_late_total.",
		[]string{"result"}, nil)
	descClaims = prometheus.NewDesc("tribe_swim_claims_total",
		"Failure detector claims that changed what this node believes (each a signature checked), by claim: alive, suspect, dead, left, and confirm (one more accuser of a suspicion held). Suspect, confirm and alive rising together on every node is a fleet too loaded to answer its probes in time.",
		[]string{"claim"}, nil)
	descRefuted = prometheus.NewDesc("tribe_swim_refutations_total",
		"Suspicions or deaths of this node it heard and refuted.", nil, nil)
	descEntries = prometheus.NewDesc("tribe_state_entries",
		"Keys of the replicated state held here, tombstones included.", nil, nil)
	descNodes = prometheus.NewDesc("tribe_nodes",
		"Nodes with a record in the replicated state, by liveness as this node sees it (alive, suspect, dead).",
		[]string{"liveness"}, nil)
	descAdmission = prometheus.NewDesc("tribe_nodes_by_admission",
		"Nodes with a record in the replicated state, by admission (open, trusted, admitted, pending, revoked).",
		[]string{"admission"}, nil)
	descRejected = prometheus.NewDesc("tribe_rejected_total",
		"Refused input by reason, as in `tribe status` (entries, sync streams, hellos, failure detector frames, calls as call_<code>).",
		[]string{"reason"}, nil)
	descDropped = prometheus.NewDesc("tribe_pubsub_dropped_total",
		"Message copies pubsub dropped under load, by queue; anti-entropy repairs them, a growing rate means an overloaded node.",
		[]string{"queue"}, nil)
	descPubsub = prometheus.NewDesc("tribe_pubsub_sent_total",
		"What pubsub sent: RPCs (part=rpc) and, in them, entries (message) and gossip control (ihave, iwant, graft, prune, idontwant). At idle, a rate that grows with the fleet is gossip whose cost per node is not flat.",
		[]string{"part"}, nil)
	descPubsubRecv = prometheus.NewDesc("tribe_pubsub_received_total",
		"What pubsub received, by part as tribe_pubsub_sent_total.",
		[]string{"part"}, nil)
	descDuplicates = prometheus.NewDesc("tribe_pubsub_duplicates_total",
		"Copies of entries pubsub received again (already seen): the price of gossip's redundancy.", nil, nil)
	descPulls = prometheus.NewDesc("tribe_sync_pulls_total",
		"Anti-entropy pulls this node made.", nil, nil)
	descPullsFailed = prometheus.NewDesc("tribe_sync_pulls_failed_total",
		"Anti-entropy pulls that failed (the peer went away, broke the protocol, or the pull timed out).", nil, nil)
	descRounds = prometheus.NewDesc("tribe_sync_rounds_total",
		"Request and response rounds of anti-entropy pulls.", nil, nil)
	descSyncBytes = prometheus.NewDesc("tribe_sync_bytes_total",
		"Bytes of anti-entropy pulls, by direction (sent, received).", []string{"direction"}, nil)
	descFetched = prometheus.NewDesc("tribe_sync_entries_fetched_total",
		"Entries received by anti-entropy pulls.", nil, nil)
	descApplied = prometheus.NewDesc("tribe_sync_entries_applied_total",
		"Entries received by anti-entropy pulls that changed the state: what pubsub did not bring.", nil, nil)
	descShared = prometheus.NewDesc("tribe_sync_entries_shared_total",
		"Entries a pull did not ask for because another pull of this node was fetching the same version (pulls that run at once fetch and check each entry once).", nil, nil)
	descRelayed = prometheus.NewDesc("tribe_sync_entries_relayed_total",
		"Entries pulled from their own author moments after it wrote them (a node that just joined), passed on by pubsub before its own mesh forms.", nil, nil)
	descRelinks = prometheus.NewDesc("tribe_peer_relinks_total",
		"Links started over because a peer restarted while this node held a connection to its previous run (so pubsub reaches it again at once).",
		nil, nil)
	descJoinRedials = prometheus.NewDesc("tribe_join_redials_total",
		"Connections to a --join peer closed and dialled again because the peer said no hello in 20 s.",
		nil, nil)
	descCallDialRetries = prometheus.NewDesc("tribe_call_dial_retries_total",
		"Calls made again, within their deadline, because their dial timed out (a connect or handshake the callee or this node was too busy to finish).",
		nil, nil)
	descCallsRelayed = prometheus.NewDesc("tribe_call_relayed_total",
		"Targets of this node's fan-outs answered through a relay (a connected member that made the call for this node, the answer signed by its target).",
		nil, nil)
	descCallsRelayedAgain = prometheus.NewDesc("tribe_call_relayed_again_total",
		"Targets a relay did not hand this node's call to (it could not reach them, or went away), sent the call directly after.",
		nil, nil)
	descOrdersRun = prometheus.NewDesc("tribe_orders_run_total",
		"Orders (calls in a fan-out through relays, signed by their caller) this node took and ran.",
		nil, nil)
	descOrdersAnsweredAgain = prometheus.NewDesc("tribe_orders_answered_again_total",
		"Orders (calls handed on by relays) that came to this node again after it had run them, answered with the answer it kept: the first answer was lost on the way.",
		nil, nil)
	descCommits = prometheus.NewDesc("tribe_store_commits_total",
		"Write transactions of the state store, each a disk sync; writes that arrive together share one.", nil, nil)
	descPlugins = prometheus.NewDesc("tribe_plugins",
		"Plugin instances this node was asked to run, one per tribe and plugin, by state (loaded, error).",
		[]string{"state"}, nil)
)

// collector turns one Snapshot per scrape into metrics.
type collector struct{ src Source }

func newCollector(src Source) prometheus.Collector { return collector{src} }

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInfo, descPeers, descHealth, descProbesLate, descProbes, descClaims, descRefuted, descEntries, descNodes, descAdmission, descRejected,
		descDropped, descPubsub, descPubsubRecv, descDuplicates, descPulls, descPullsFailed, descRounds, descSyncBytes, descFetched, descApplied, descShared, descRelayed, descRelinks, descJoinRedials, descCallDialRetries, descCallsRelayed, descCallsRelayedAgain, descOrdersRun, descOrdersAnsweredAgain, descCommits, descPlugins} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Snapshot()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(descInfo, 1, s.ID, s.Name, s.Cluster, s.Version)
	gauge(descPeers, float64(s.Peers))
	gauge(descHealth, float64(s.ProbeHealth))
	counter(descProbesLate, s.ProbesLate)
	for k, v := range s.Probes {
		counter(descProbes, v, k)
	}
	for k, v := range s.Claims {
		counter(descClaims, v, k)
	}
	counter(descRefuted, s.Refutations)
	gauge(descEntries, float64(s.Entries))
	for k, v := range s.NodesByLiveness {
		gauge(descNodes, float64(v), k)
	}
	for k, v := range s.NodesByAdmission {
		gauge(descAdmission, float64(v), k)
	}
	for k, v := range s.Plugins {
		gauge(descPlugins, float64(v), k)
	}
	for k, v := range s.Rejected {
		counter(descRejected, v, k)
	}
	for k, v := range s.Dropped {
		counter(descDropped, v, k)
	}
	for k, v := range s.Pubsub.Sent {
		counter(descPubsub, v, k)
	}
	for k, v := range s.Pubsub.Received {
		counter(descPubsubRecv, v, k)
	}
	counter(descDuplicates, s.Pubsub.Duplicates)
	counter(descPulls, s.Sync.Pulls)
	counter(descPullsFailed, s.Sync.Failed)
	counter(descRelinks, s.Sync.Relinks)
	counter(descJoinRedials, s.Sync.JoinRedials)
	counter(descCallDialRetries, s.CallDialRetries)
	counter(descCallsRelayed, s.CallsRelayed)
	counter(descCallsRelayedAgain, s.CallsRelayedAgain)
	counter(descOrdersRun, s.OrdersRun)
	counter(descOrdersAnsweredAgain, s.OrdersAnsweredAgain)
	counter(descRounds, s.Sync.Rounds)
	counter(descSyncBytes, s.Sync.BytesSent, "sent")
	counter(descSyncBytes, s.Sync.BytesRecv, "received")
	counter(descFetched, s.Sync.Fetched)
	counter(descApplied, s.Sync.Applied)
	counter(descShared, s.Sync.Shared)
	counter(descRelayed, s.Sync.Relayed)
	counter(descCommits, s.StoreCommits)
}
