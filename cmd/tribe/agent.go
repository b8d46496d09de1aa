package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/tribeagent/tribe/internal/resident"
	"github.com/tribeagent/tribe/internal/timerslack"
	"github.com/tribeagent/tribe/node"
	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/policy"
)

func agentCommand() *cli.Command {
	return &cli.Command{
		Name:  "agent",
		Usage: "run the tribe agent on this host",
		Description: `Starts the agent with embedded defaults: data dir ~/.tribe (or --data-dir),
listening on TCP and QUIC port 4001, mDNS discovery on the LAN, cluster "tribe".
A second agent on the same host needs its own --data-dir and --listen port;
it finds the first by mDNS, or by --join with an address from ` + "`tribe status`" + `.
Flags override the config file; SIGINT or SIGTERM shut the agent down cleanly;
SIGHUP (or tribe reload) reads the config file and the facts again.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "name", Usage: "the node's name (default: the host name)"},
			&cli.StringSliceFlag{Name: "listen", Usage: "multiaddr to listen on, repeatable (default: /ip4/0.0.0.0/tcp/4001 and /ip4/0.0.0.0/udp/4001/quic-v1; port 0 picks a free port)"},
			&cli.StringSliceFlag{Name: "join", Usage: "peer to join: HOST:PORT (TCP; the peer ID is learnt in the handshake) or a multiaddr from `tribe status` on that host, repeatable; retried with backoff until connected"},
			&cli.BoolFlag{Name: "no-mdns", Usage: "turn off mDNS discovery on the local network"},
			&cli.StringFlag{Name: "cluster", Value: "tribe", Usage: "cluster name: agents of different clusters do not find each other"},
			&cli.StringFlag{Name: "swarm-key", Usage: "libp2p swarm key file (pnet): only agents with the same key can connect; TCP only"},
			&cli.StringFlag{Name: "config", Usage: "agent config file (YAML or JSON): name, cluster, listen, join, mdns, swarm_key, trusted, auto_admit, target_peers, facts_file, exec, file_dir, plugin_dir, accept_plugins, file_max_bytes, log_level, log_format, reconnect_timeout, metrics_addr, conns_per_ip, job_queue, job_retention, procs"},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text (key=value lines) or json (one object per line)"},
			&cli.StringSliceFlag{Name: "fact", Usage: "user fact key=value, repeatable; the value is typed: true/false, whole number, decimal, else text"},
			&cli.StringFlag{Name: "facts-file", Usage: "YAML or JSON file of user facts (nested values allowed), read again on SIGHUP and tribe reload"},
			&cli.StringSliceFlag{Name: "trusted", Usage: "peer ID of a trusted writer of tribe state, repeatable; with any, other nodes count only once a trusted writer admits them (tribe admit); none means every peer that can connect is trusted"},
			&cli.StringFlag{Name: "auto-admit", Usage: "on a trusted writer: admit every pending node whose facts match this CEL expression, e.g. 'facts.os == \"linux\"' (revoked nodes stay revoked)"},
			&cli.StringSliceFlag{Name: "exec", Usage: "NAME=COMMAND the exec plugin may run when asked for NAME, repeatable; COMMAND is split on spaces, no shell (the config file's exec.commands also sets timeouts and output caps)"},
			&cli.BoolFlag{Name: "exec-any", Usage: "let callers run any command line through the exec plugin, not only the defined ones: a remote shell for every trusted writer and tribe member"},
			&cli.StringFlag{Name: "file-dir", Usage: "where the file plugin writes (default: <data-dir>/files)"},
			&cli.StringFlag{Name: "accept-plugins", Usage: "\"trusted\": fetch, check and run the plugins trusted writers share (tribe plugin add); needs --trusted. Default: run only what this host installed"},
			&cli.StringFlag{Name: "plugin-dir", Usage: "external plugins: each executable here named like a plugin is one this host can load (default: <data-dir>/plugins; see the README, \"Write a plugin\")"},
			&cli.DurationFlag{Name: "probe-interval", Hidden: true, Usage: "how often the failure detector probes one member (default 1s; a probe times out after half of it). For tests: a crashed agent is dead within seconds at 100ms"},
			&cli.DurationFlag{Name: "reconnect-timeout", Usage: "how long a dead or left node stays in this agent's views (nodes, members, names) after it was last heard from; then it is reaped until it is heard from again", DefaultText: "72h"},
			&cli.Int64Flag{Name: "file-max-bytes", Usage: "cap on each file the file plugin writes, beyond which publish is refused; a tribe's max_bytes only lowers it", DefaultText: "64 MiB"},
			&cli.IntFlag{Name: "conns-per-ip", Usage: "cap on connections with one IPv4 address or IPv6 /56, both ways; raise it where more agents share one public address (a NAT)", DefaultText: "256 (2 x the connection manager's high water mark)"},
			&cli.IntFlag{Name: "job-queue", Usage: "how many jobs may wait in one tribe's queue on this agent; past that the oldest is dropped and its ack says so", DefaultText: "1000"},
			&cli.DurationFlag{Name: "job-retention", Usage: "how long a finished job, its acks and the outputs kept on its targets stay before they are collected", DefaultText: "168h (7 days)"},
			&cli.IntFlag{Name: "procs", Usage: "how many cores the agent may use at once (Go's GOMAXPROCS; 0: every core); GOMAXPROCS in the environment still decides", DefaultText: "1"},
			&cli.StringFlag{Name: "metrics-addr", Usage: "serve Prometheus metrics (/metrics) and a health check (/healthz) on this TCP HOST:PORT, e.g. 127.0.0.1:9464; port 0 picks a free port (tribe status shows it); off by default"},
		},
		Action: runAgent,
	}
}

// gcPercent is the agent's GOGC unless the environment sets one, from
// idleGCAfter after the agent is ready; until then Go's default (100).
// The start allocates most of what an agent ever will at once (package
// inits, the host, the store, the first handshakes and state), with a
// live heap of 1-3 MB: at 50% the collector ran every megabyte or so.
const (
	gcPercent   = 50
	idleGCAfter = 10 * time.Second
)

// timerSlack is how late the kernel may wake the agent's threads from a
// timed sleep: sysmon's 20 µs naps become about a millisecond, and the
// agent's own timers (probes every second, timeouts of hundreds of
// milliseconds) do not notice. The commands and plugins it starts inherit it.
const timerSlack = time.Millisecond

func runAgent(c *cli.Context) error {
	if err := noArgs(c); err != nil {
		return err
	}
	cfg, err := agentConfig(c)
	if err != nil {
		return err
	}
	level, err := node.LogLevelVar(cfg.LogLevel)
	if err != nil {
		return usageError{err} // Validate has checked it
	}
	log, err := node.NewLevelLogger(c.App.ErrWriter, level, cfg.LogFormat)
	if err != nil {
		return usageError{err}
	}
	// An idle agent's heap is mostly garbage awaiting the next collection
	// (live data 3 MB in a cluster of 20, the goal 9 MB at Go's default
	// GOGC of 100, stacks counted): collecting at 50% growth keeps 2 MB
	// less resident at no idle CPU measurable here. Starting, it would
	// cost CPU (see gcPercent), so the pace changes once the start is
	// over. GOGC in the environment still decides.
	lowerGC := os.Getenv("GOGC") == ""
	// One core unless told otherwise (see node.DefaultProcs); 0 leaves
	// Go's default, every core the process may use. GOMAXPROCS in the
	// environment still decides.
	if os.Getenv("GOMAXPROCS") == "" && cfg.Procs > 0 {
		runtime.GOMAXPROCS(cfg.Procs)
	}
	// Go's system monitor wakes every 20 µs of each burst of work; a
	// coarser timer slack makes those wake-ups rarer (see timerslack).
	// Other threads' need CAP_SYS_NICE; the packaged unit sets it for the
	// whole process instead (TimerSlackNSec=).
	if n, err := timerslack.Set(timerSlack.Nanoseconds()); err != nil {
		log.Debug("timer slack not set on every thread: it needs CAP_SYS_NICE, or TimerSlackNSec= in a systemd unit", "slack", timerSlack, "set", n, "err", err)
	}
	// The process ends with Run, so the signal relay is never stopped
	// (signal.Stop was seen to stall shutdown for ~30 s here).
	ctx, cancel := context.WithCancel(c.Context)
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigs
		cancel()
	}()
	// tribe reload and SIGHUP read the config file and the flags again.
	reload := func() (node.Config, error) {
		cfg, err := agentConfig(c)
		var u usageError
		if errors.As(err, &u) {
			err = u.err
		}
		return cfg, err
	}
	// Caught from now on, not from ready: until then a SIGHUP would end
	// the agent (systemd counts that a clean exit and does not restart
	// it). One that comes before ready is one reload after it.
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	return node.Run(ctx, cfg, node.Deps{Logger: log, LogLevel: level, Reload: reload}, func(n *node.Node) {
		if lowerGC {
			time.AfterFunc(idleGCAfter, func() { debug.SetGCPercent(gcPercent) })
		}
		// Start-up touched most of the binary; give back what idling
		// does not use (see package resident).
		go resident.Keep(ctx.Done(), func(released int64, err error) {
			if err != nil {
				log.Warn("giving back the binary's unused pages", "err", err)
				return
			}
			log.Debug("gave back the binary's resident pages; those in use fault back in", "bytes", released)
		})
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-hups:
					if _, err := n.Reload(ctx); err != nil {
						log.Warn("reloading on SIGHUP", "err", err)
					}
				}
			}
		}()
	})
}

// agentConfig builds the node config: defaults, then the config file, then
// the flags that were given.
func agentConfig(c *cli.Context) (node.Config, error) {
	cfg := node.DefaultConfig()
	cfg.DataDir = flagString(c, "data-dir")
	if path := c.String("config"); path != "" {
		if err := node.LoadConfigFile(path, &cfg); err != nil {
			return cfg, err
		}
	}
	for flag, dst := range map[string]*string{"log-level": &cfg.LogLevel, "log-format": &cfg.LogFormat} {
		if c.IsSet(flag) {
			*dst = c.String(flag)
			if _, err := node.NewLogger(io.Discard, cfg.LogLevel, cfg.LogFormat); err != nil {
				return cfg, usagef("--%s: %v", flag, err)
			}
		}
	}
	// Flags that replace one setting when given.
	for flag, dst := range map[string]*string{"name": &cfg.Name, "facts-file": &cfg.FactsFile, "auto-admit": &cfg.AutoAdmit,
		"swarm-key": &cfg.SwarmKeyFile, "file-dir": &cfg.FileDir, "plugin-dir": &cfg.PluginDir, "accept-plugins": &cfg.AcceptPlugins, "metrics-addr": &cfg.MetricsAddr} {
		if c.IsSet(flag) {
			*dst = c.String(flag)
		}
	}
	for flag, dst := range map[string]*[]string{"listen": &cfg.ListenAddrs, "join": &cfg.Join, "trusted": &cfg.Trusted} {
		if c.IsSet(flag) {
			*dst = c.StringSlice(flag)
		}
	}
	for flag, dst := range map[string]*time.Duration{"probe-interval": &cfg.ProbeInterval, "reconnect-timeout": &cfg.ReconnectTimeout, "job-retention": &cfg.JobRetention} {
		if c.IsSet(flag) {
			*dst = c.Duration(flag)
		}
	}
	if c.IsSet("conns-per-ip") {
		cfg.ConnsPerIP = c.Int("conns-per-ip")
	}
	if c.IsSet("procs") {
		cfg.Procs = c.Int("procs")
	}
	if c.IsSet("job-queue") {
		cfg.JobQueue = c.Int("job-queue")
	}
	if c.IsSet("file-max-bytes") {
		cfg.FileMaxBytes = c.Int64("file-max-bytes")
	}
	if c.IsSet("cluster") || cfg.Cluster == "" {
		cfg.Cluster = c.String("cluster")
	}
	if c.Bool("no-mdns") {
		cfg.MDNS = false
	}
	if c.IsSet("fact") {
		cfg.Facts = policy.Facts{}
		for _, f := range c.StringSlice("fact") {
			k, v, err := policy.ParseFact(f)
			if err != nil {
				return cfg, usageError{fmt.Errorf("--fact: %w", err)}
			}
			cfg.Facts[k] = v
		}
	}
	if c.IsSet("exec") {
		if cfg.Exec.Commands == nil {
			cfg.Exec.Commands = map[string]plugins.Command{}
		}
		for _, e := range c.StringSlice("exec") {
			name, command, ok := strings.Cut(e, "=")
			if !ok || name == "" || len(strings.Fields(command)) == 0 {
				return cfg, usagef("--exec %q: want NAME=COMMAND, such as uptime=uptime", e)
			}
			cfg.Exec.Commands[name] = plugins.Command{Argv: strings.Fields(command)}
		}
	}
	if c.Bool("exec-any") {
		cfg.Exec.AllowAny = true
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usageError{fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "node: "))}
	}
	return cfg, nil
}
