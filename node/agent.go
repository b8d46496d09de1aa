package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/node/api/metrics"
	"github.com/tribeagent/tribe/node/sdnotify"
)

// shutdownTimeout bounds how long Run waits for API calls in flight.
const shutdownTimeout = 5 * time.Second

// Run is `tribe agent`: it builds and starts a node from cfg and deps
// (deps.Logger logs), serves the control API on <data-dir>/tribe.sock once
// the node is up, and shuts both down (socket removed, state saved,
// farewell said) when ctx ends or `tribe leave` asks.
// ready, if not nil, is called once the API answers. Under systemd
// (Type=notify) it reports READY=1 once the API answers and STOPPING=1 when
// shutdown begins.
func Run(ctx context.Context, cfg Config, deps Deps, ready func(*Node)) error {
	systemd := sdnotify.FromEnv()
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	deps.Logger = log
	n, err := New(cfg, deps)
	if err != nil {
		return err
	}
	if err := n.Start(ctx); err != nil {
		return errors.Join(err, n.Close())
	}
	msrv, err := n.serveMetrics(log)
	if err != nil {
		return errors.Join(err, n.Close())
	}
	var srv *api.Server
	if cfg.API {
		srv, err = api.Listen(filepath.Join(cfg.DataDir, api.SocketName), n, log)
		if err != nil {
			return errors.Join(err, shutdownMetrics(msrv), n.Close())
		}
		log.Info("agent ready", "socket", srv.Path(), "id", n.ID())
	}
	if ready != nil {
		ready(n)
	}
	notify(log, systemd, sdnotify.Ready)
	select {
	case <-ctx.Done():
	case <-n.Leaving():
	}
	log.Info("shutting down")
	notify(log, systemd, sdnotify.Stopping)
	n.stopWatches() // watch streams never end by themselves
	var errs []error
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		errs = append(errs, srv.Shutdown(sctx))
		cancel()
	}
	errs = append(errs, shutdownMetrics(msrv), n.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("node: shutdown: %w", err)
	}
	return nil
}

// notify tells systemd the agent's state, if systemd asked to be told. A
// failure is logged, not fatal: systemd then times the start out itself.
func notify(log *slog.Logger, systemd sdnotify.Socket, state string) {
	if _, err := systemd.Notify(state); err != nil {
		log.Warn("telling systemd", "state", state, "err", err)
	}
}

// Status implements api.Agent.
func (n *Node) Status(ctx context.Context) (api.Status, error) {
	now := n.now()
	return api.Status{
		ID:        n.host.ID().String(),
		Name:      n.cfg.Name,
		Cluster:   n.cfg.Cluster,
		Version:   Version,
		Addrs:     p2pAddrs(n.host.ID(), n.host.Addrs()),
		Peers:     len(n.ConnectedPeers()),
		MDNS:      n.cfg.MDNS,
		Private:   n.private,
		DataDir:   n.cfg.DataDir,
		Started:   n.started,
		Uptime:    now.Sub(n.started),
		JoinAddr:  n.cfg.Join,
		Trust:     trustMode(n.replica.Trust()),
		Trusted:   trustedList(n.replica.Trust()),
		Admission: string(n.rules().Status(n.host.ID())),
		Pending:   n.pendingCount(),
		Entries:   n.replica.Len(),
		StateHash: fmt.Sprintf("%x", n.replica.Hash()),
		Rejected:  n.rejected(),
		Dropped:   n.drops.Counts(),
		Joins:     n.joinStatus(),

		MetricsAddr: n.MetricsAddr(),
	}, nil
}

func trustMode(t gossip.Trust) string {
	if t.Open() {
		return "open"
	}
	return "list"
}

func trustedList(t gossip.Trust) []string {
	var out []string
	for _, p := range t.Peers() {
		out = append(out, p.String())
	}
	slices.Sort(out)
	return out
}

// rejected merges the counters of refused input.
func (n *Node) rejected() map[string]int64 {
	out := n.replica.Rejected()
	out["bad_swim"] = n.swim.bad.Load()
	out["swim_busy"] = n.swim.busy.Load()
	out["bad_hello"] = n.badHello.Load()
	out["hello_busy"] = n.helloBusy.Load()
	out["conns_shed"] = n.sheds.count.Load()
	out["busy_not_dialled"] = n.sheds.notDialled.Load()
	out["referrals_skipped"] = n.sheds.skipped.Load()
	out["membership_unbacked"] = n.auth.unbacked.Load()
	out["policy_unusable"] = n.unusable.count.Load()
	out["name_taken"] = n.auth.nameTaken.Load()
	out["facts_refused"] = n.facts.refused.Load()
	out["reload_refused"] = n.reloads.refused.Load()
	out["mdns_finds_skipped"] = n.mdnsGate.skipped.Load()
	out["dht_provider_refused"] = n.providers.refused.Load()
	if g, ok := n.host.Network().ResourceManager().(*handshakeGuard); ok {
		out["handshakes_refused"] = g.refused.Load()
	}
	out["task_watch_refused"] = n.tasks.watchRefused.Load()
	out["task_watch_overlong"] = n.tasks.watchOverlong.Load()
	out["job_unreadable"] = n.jobs.unreadable.Load()
	out["job_output_refused"] = n.jobs.outputRefused.Load()
	out["job_list_refused"] = n.jobs.listRefused.Load()
	out["job_handoff_refused"] = n.jobs.handRefused.Load()
	out["job_ack_refused"] = n.jobs.ackRefused.Load()
	out["job_handoff_busy"] = n.jobs.handBusy.Load()
	out["job_handoff_unstored"] = n.jobs.handUnstored.Load()
	out["plugin_fetch_busy"] = n.sharing.busy.Load()
	out["plugin_hash_mismatch"] = n.sharing.hashMismatch.Load()
	out["plugin_fetch_refused"] = n.sharing.refused.Load()
	out["plugin_fetch_bad_answer"] = n.sharing.badAnswer.Load()
	out["plugin_bad_lines"] = n.plugins.badLines()
	out["job_output_bad_answer"] = n.jobs.outputBadAnswer.Load()
	out["job_list_bad_answer"] = n.jobs.listBadAnswer.Load()
	out["task_watch_malformed"] = n.tasks.watchMalformed.Load()
	n.tasks.watch.mu.Lock()
	out["task_watch_dropped"] = n.tasks.watch.dropped
	n.tasks.watch.mu.Unlock()
	for code, c := range n.calls.Refused() {
		out["call_"+string(code)] = c
	}
	return out
}

// Peers implements api.Agent: the connected peers of this cluster, by name.
func (n *Node) Peers(ctx context.Context) ([]api.Peer, error) {
	out := []api.Peer{}
	for _, p := range n.ConnectedPeers() {
		info, _ := n.peers.get(p)
		out = append(out, api.Peer{
			ID:    p.String(),
			Name:  info.Name,
			Addrs: p2pAddrs(p, n.host.Peerstore().Addrs(p)),
		})
	}
	slices.SortFunc(out, func(a, b api.Peer) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
}

// p2pAddrs renders addrs as full multiaddrs ending in /p2p/<id>, ready to be
// passed to --join.
func p2pAddrs(id peer.ID, addrs []ma.Multiaddr) []string {
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		full, err := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: id, Addrs: []ma.Multiaddr{a}})
		if err != nil || len(full) == 0 {
			continue
		}
		out = append(out, full[0].String())
	}
	slices.Sort(out)
	return out
}

// serveMetrics serves the node's metrics and health check on
// Config.MetricsAddr, if it is set (nil server otherwise).
func (n *Node) serveMetrics(log *slog.Logger) (*metrics.Server, error) {
	if n.metrics == nil {
		return nil, nil
	}
	srv, err := metrics.Listen(n.cfg.MetricsAddr, n.metrics.Handler(metricsSource{n}, log), log)
	if err != nil {
		return nil, err
	}
	addr := srv.Addr()
	n.metricsAddr.Store(&addr)
	log.Info("serving metrics", "addr", addr, "metrics", "http://"+addr+"/metrics", "health", "http://"+addr+"/healthz")
	return srv, nil
}

func shutdownMetrics(srv *metrics.Server) error {
	if srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	return srv.Shutdown(ctx)
}

// MetricsAddr is the TCP address the metrics are served on (the port
// picked, for port 0), or "" when they are not.
func (n *Node) MetricsAddr() string {
	if p := n.metricsAddr.Load(); p != nil {
		return *p
	}
	return ""
}
