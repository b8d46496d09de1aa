package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

func reloadCommand() *cli.Command {
	return &cli.Command{
		Name:  "reload",
		Usage: "make the local agent read its config file and facts again (as SIGHUP does)",
		Description: `The agent reads its configuration again the way it was built at start (the
config file given with --config, then its command-line flags) and applies,
all or nothing, what can change while it runs: the exec plugin's commands
(exec), user facts (facts_file, --fact), log_level, reconnect_timeout and
the trusted writers (trusted: the state is loaded again under the new list);
then it collects its facts again and re-evaluates the policies. A file that
does not parse or validate, or facts that are refused, change nothing and
the command fails. Settings that differ but need a restart (name, cluster,
listen, join, mdns, swarm_key, auto_admit, target_peers, file_dir, plugin_dir, accept_plugins,
file_max_bytes, log_format, metrics_addr, conns_per_ip) keep their running values and are
listed.`,
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			res, err := client(c).Reload(c.Context)
			if err != nil {
				return err
			}
			if flagBool(c, "json") {
				return printJSON(c.App.Writer, res)
			}
			w := c.App.Writer
			switch {
			case len(res.Changed) > 0:
				fmt.Fprintf(w, "reloaded: %s changed\n", strings.Join(res.Changed, ", "))
			default:
				fmt.Fprintln(w, "reloaded: no setting changed")
			}
			if res.FactsChanged {
				fmt.Fprintln(w, "facts changed; policies evaluated again")
			}
			if len(res.RestartNeeded) > 0 {
				fmt.Fprintf(w, "restart the agent to apply: %s (they keep their running values)\n", strings.Join(res.RestartNeeded, ", "))
			}
			return nil
		},
	}
}
