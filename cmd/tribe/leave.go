package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/node/api"
)

// leaveCommand is both of the CLI contract's leaves: with no arguments
// this agent leaves the cluster (Serf's leave); with a tribe and nodes it
// removes their manual membership of the tribe.
func leaveCommand() *cli.Command {
	return &cli.Command{
		Name:      "leave",
		Usage:     "with no arguments: this agent leaves the cluster cleanly and stops; with TRIBE NODE...: remove nodes' manual membership of a tribe",
		ArgsUsage: "[TRIBE NODE...]",
		Description: `tribe leave (no arguments) makes the local agent announce that it is leaving,
signed in its own record, wait briefly for a peer to acknowledge it, and
stop: other nodes show it as left (not suspect, then dead) until it comes
back. SIGINT and SIGTERM do the same. tribe leave TRIBE NODE... removes the
manual membership of each NODE (name or peer ID) in TRIBE.`,
		Action: func(c *cli.Context) error {
			switch c.NArg() {
			case 0:
				return leaveCluster(c)
			case 1:
				return usagef("leave takes no arguments (this agent leaves the cluster) or a tribe and at least one node (they leave the tribe)")
			}
			return membership(c, (*api.Client).Leave)
		},
	}
}

func leaveCluster(c *cli.Context) error {
	res, err := client(c).LeaveCluster(c.Context)
	if err != nil {
		return err
	}
	if flagBool(c, "json") {
		return printJSON(c.App.Writer, res)
	}
	if res.Error != "" {
		fmt.Fprintf(c.App.ErrWriter, "tribe: warning: %s\n", res.Error)
	}
	fmt.Fprintf(c.App.Writer, "%s left the cluster (%d peers acknowledged); the agent is stopping\n", res.Name, res.Acked)
	return nil
}

func forceLeaveCommand() *cli.Command {
	return &cli.Command{
		Name:      "force-leave",
		Usage:     "make every node treat nodes as left and reap them at once (trusted writers only), until they come back with a newer record",
		ArgsUsage: "NODE...",
		Description: `For nodes that are gone for good (a host rebuilt under the same name with a
fresh data dir): each node hides them from nodes, members and name
resolution at once instead of after --reconnect-timeout, and their names are
free. A node that is still up answers with a newer record and is back.`,
		Action: func(c *cli.Context) error {
			if !c.Args().Present() {
				return usagef("force-leave takes node names or peer IDs")
			}
			nodes, err := client(c).ForceLeave(c.Context, c.Args().Slice())
			if err != nil {
				return err
			}
			if flagBool(c, "json") {
				return printJSON(c.App.Writer, nodes)
			}
			for _, n := range nodes {
				fmt.Fprintf(c.App.Writer, "force-left %s %s\n", names.Shown(n.Name), n.ID)
			}
			return nil
		},
	}
}
