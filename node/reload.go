package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/keys"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/policy"
)

// Reloader rebuilds the agent's configuration the way it was built at
// start (defaults, the config file, then the command-line flags), for
// `tribe reload` and SIGHUP. It returns a validated Config or an error.
type Reloader func() (Config, error)

// ErrNoReload is returned by Reload on a node that was given no Reloader
// (the simulator's nodes, tests).
var ErrNoReload = errors.New("node: this agent cannot reload its configuration")

// live holds the settings `tribe reload` changes while the agent runs.
// Readers take a snapshot with Node.settings; Reload swaps it whole.
type live struct {
	facts            policy.Facts
	factsFile        string
	exec             plugins.ExecConfig
	reconnectTimeout time.Duration
	logLevel         string
}

func liveOf(c Config) *live {
	return &live{facts: c.Facts, factsFile: c.FactsFile, exec: c.Exec, reconnectTimeout: c.ReconnectTimeout, logLevel: c.LogLevel}
}

// settings is the current snapshot of the live settings.
func (n *Node) settings() *live { return n.live.Load() }

// setting is one configuration setting as the config file names it, and
// how to read it from a Config.
type setting struct {
	name string
	get  func(Config) any
}

// liveSettings change without a restart; restartSettings need one. The
// names are the config file's keys (fact: the --fact flags).
var (
	liveSettings = []setting{
		{"exec", func(c Config) any {
			if len(c.Exec.Commands) == 0 {
				c.Exec.Commands = nil // none and an empty table are the same
			}
			return c.Exec
		}},
		{"fact", func(c Config) any { return c.Facts }},
		{"facts_file", func(c Config) any { return c.FactsFile }},
		{"log_level", func(c Config) any { return c.LogLevel }},
		{"reconnect_timeout", func(c Config) any { return c.ReconnectTimeout }},
		{"trusted", func(c Config) any { return trustOf(c).Peers() }},
	}
	restartSettings = []setting{
		{"name", func(c Config) any { return c.Name }},
		{"cluster", func(c Config) any { return c.Cluster }},
		{"listen", func(c Config) any { return c.ListenAddrs }},
		{"join", func(c Config) any { return c.Join }},
		{"mdns", func(c Config) any { return c.MDNS }},
		{"swarm_key", func(c Config) any { return c.SwarmKeyFile }},
		{"auto_admit", func(c Config) any { return c.AutoAdmit }},
		{"target_peers", func(c Config) any { return c.TargetPeers }},
		{"file_dir", func(c Config) any { return c.FileDir }},
		{"plugin_dir", func(c Config) any { return c.PluginDir }},
		{"accept_plugins", func(c Config) any { return c.AcceptPlugins }},
		{"file_max_bytes", func(c Config) any { return c.FileMaxBytes }},
		{"log_format", func(c Config) any { return c.LogFormat }},
		{"metrics_addr", func(c Config) any { return c.MetricsAddr }},
		{"conns_per_ip", func(c Config) any { return c.ConnsPerIP }},
		{"job_queue", func(c Config) any { return c.JobQueue }},
		{"job_retention", func(c Config) any { return c.JobRetention }},
		{"procs", func(c Config) any { return c.Procs }},
		{"data_dir", func(c Config) any { return c.DataDir }},
	}
)

// reloadDiff is the pure rule of a reload: which settings differ between
// the running config and the one read again, split into those applied live
// and those that need a restart. An unset name in the new config (the host
// name, looked up by New) is not a change.
func reloadDiff(running, reread Config) (changed, restart []string) {
	if reread.Name == "" {
		reread.Name = running.Name
	}
	for _, s := range liveSettings {
		if !same(s.get(running), s.get(reread)) {
			changed = append(changed, s.name)
		}
	}
	for _, s := range restartSettings {
		if !same(s.get(running), s.get(reread)) {
			restart = append(restart, s.name)
		}
	}
	return changed, restart
}

// same compares settings; an empty slice or map is the same as none.
func same(a, b any) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	switch va.Kind() {
	case reflect.Slice, reflect.Map:
		if va.Len() == 0 && vb.Len() == 0 {
			return true
		}
	}
	return reflect.DeepEqual(a, b)
}

// Reload implements api.Agent: it reads the configuration again and
// applies, all or nothing, what can change while the agent runs (the exec
// plugin's commands, user facts and the facts file, the log level, the
// reconnect timeout), then collects the facts again. A configuration that
// does not read or validate, or facts that are refused, change nothing.
// Settings that need a restart are reported, and keep their running value.
func (n *Node) Reload(ctx context.Context) (api.ReloadResult, error) {
	if n.reloader == nil {
		return api.ReloadResult{}, ErrNoReload
	}
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	reread, err := n.reloader()
	if err != nil {
		n.reloads.refused.Add(1)
		return api.ReloadResult{}, fmt.Errorf("%w (nothing changed)", err)
	}
	changed, restart := reloadDiff(n.inForce, reread)
	if slices.Contains(changed, "trusted") && trustOf(reread).Open() && !n.replica.Trust().Open() {
		// A line commented out and a reload would let every peer that
		// can connect write the fleet's state and run its plugins.
		n.reloads.refused.Add(1)
		return api.ReloadResult{}, errors.New("node: the config names no trusted writer: a reload does not open trust to every peer that can connect; restart the agent to do that (nothing changed)")
	}
	if slices.Contains(restart, "swarm_key") && reread.SwarmKeyFile != "" {
		if _, err := keys.LoadSwarmKey(reread.SwarmKeyFile); err != nil { // or the next start fails
			n.reloads.refused.Add(1)
			return api.ReloadResult{}, fmt.Errorf("node: swarm_key: %w (nothing changed)", err)
		}
	}
	next := liveOf(reread)
	level, err := logLevel(next.logLevel)
	if err != nil { // Validate has checked it; a Reloader that did not is refused
		n.reloads.refused.Add(1)
		return api.ReloadResult{}, fmt.Errorf("node: %w (nothing changed)", err)
	}
	facts, err := n.gatherFacts(ctx, next)
	if err != nil {
		n.reloads.refused.Add(1)
		n.facts.refused.Add(1)
		return api.ReloadResult{}, fmt.Errorf("%w (nothing changed)", refused(err))
	}
	// Taking the trust list and writing the record are the steps that can
	// still fail: the second undoes the first, so a refusal leaves
	// everything as it was.
	oldTrust := n.replica.Trust()
	trustChanged := slices.Contains(changed, "trusted")
	if trustChanged {
		if err := n.setTrust(trustOf(reread)); err != nil {
			n.reloads.refused.Add(1)
			return api.ReloadResult{}, fmt.Errorf("node: trust list: %w (nothing changed)", err)
		}
	}
	factsChanged, err := n.adoptFacts(ctx, facts)
	if err != nil {
		n.reloads.refused.Add(1)
		if errors.Is(err, ErrFactsRefused) {
			n.facts.refused.Add(1)
		}
		if trustChanged {
			if terr := n.setTrust(oldTrust); terr != nil {
				err = errors.Join(err, fmt.Errorf("restoring the trust list: %w", terr))
			}
		}
		return api.ReloadResult{}, fmt.Errorf("%w (nothing changed)", err)
	}
	if trustChanged {
		n.forgetOthersAcks() // only now: a refused reload restores the old list, not what was forgotten
	}
	n.live.Store(next)
	if n.logLevel != nil {
		n.logLevel.Set(level)
	}
	applyLive(&n.inForce, reread)
	if factsChanged {
		n.triggerReconcile()
	}
	n.reloads.done.Add(1)
	res := api.ReloadResult{Changed: orEmpty(changed), RestartNeeded: orEmpty(restart), FactsChanged: factsChanged}
	n.log.Info("configuration reloaded", "changed", res.Changed, "facts_changed", factsChanged)
	if len(restart) > 0 {
		n.log.Warn("configuration reloaded, but these settings keep their running values until the agent restarts", "restart_needed", restart)
	}
	return res, nil
}

// applyLive copies the live settings from reread into the config in
// force, so the next reload compares against what is applied.
func applyLive(inForce *Config, reread Config) {
	inForce.Exec, inForce.Facts, inForce.FactsFile = reread.Exec, reread.Facts, reread.FactsFile
	inForce.LogLevel, inForce.ReconnectTimeout, inForce.Trusted = reread.LogLevel, reread.ReconnectTimeout, reread.Trusted
}

// trustOf is the trust list a config names (Validate has checked the IDs).
func trustOf(c Config) gossip.Trust {
	var ids []peer.ID
	for _, s := range c.Trusted {
		if id, err := peer.Decode(s); err == nil {
			ids = append(ids, id)
		}
	}
	return gossip.NewTrust(ids...)
}

// forgetOthersAcks drops other nodes' acks once this node is no longer a
// trusted writer: they are not its to keep (jobacks.go).
func (n *Node) forgetOthersAcks() {
	if n.holdsAllAcks() {
		return
	}
	if err := n.replica.Forget(n.othersAcks()...); err != nil {
		n.log.Warn("forgetting other nodes' acks once not a trusted writer", "err", err)
	}
}

// setTrust puts a trust list in force: the replica loads its state again
// under it (watchers see what changed), the rules judge by it, and what
// depends on this node's own standing (the plugins it runs, its policy
// memberships, auto-admission) is checked again.
func (n *Node) setTrust(t gossip.Trust) error {
	if _, err := n.replica.SetTrust(t); err != nil {
		return err
	}
	n.auth.setTrusted(t)
	n.auth.mu.Lock()
	n.auth.policyGen++ // which policies exist may have changed
	clear(n.auth.backed)
	n.auth.mu.Unlock()
	n.pokePlugins()
	n.triggerReconcile()
	select {
	case n.admitCh <- struct{}{}:
	default:
	}
	if t.Open() {
		n.log.Warn("no trust list: every peer that can connect may write tribe state and call every plugin (set --trusted, and a swarm key)")
	} else {
		n.log.Info("trust list in force", "trusted", len(t.Peers()), "this node", string(n.rules().Status(n.host.ID())))
	}
	return nil
}

// reloadCounters count reloads done and refused.
type reloadCounters struct {
	done, refused atomic.Int64
}

// LogLevelVar builds a level variable at level for a logger that Reload can
// change (see Deps.LogLevel).
func LogLevelVar(level string) (*slog.LevelVar, error) {
	l, err := logLevel(level)
	if err != nil {
		return nil, err
	}
	v := new(slog.LevelVar)
	v.Set(l)
	return v, nil
}
