package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/tribeagent/tribe/node/api"
)

func admitCommand() *cli.Command {
	return &cli.Command{
		Name:      "admit",
		Usage:     "admit nodes (trusted writers only): their records and memberships count from now on",
		ArgsUsage: "NODE...",
		Description: `With --trusted set, a node's own entries count only once a trusted writer
has admitted it; until then it is listed as pending (tribe nodes --pending)
and can neither call nor be called. NODE is a name or a peer ID. The
node is admitted under the name its record carries, and from then on
answers to that name; a name another admitted node holds, even one that
is down, is refused (start the new node with another --name, or revoke
the holder). Admitting a node again binds the name its record carries
now. --all-pending admits every pending node whose name is free; revoked
nodes are not pending and stay revoked.`,
		Flags: []cli.Flag{&cli.BoolFlag{Name: "all-pending", Usage: "admit every pending node"}},
		Action: func(c *cli.Context) error {
			all := c.Bool("all-pending")
			if all == c.Args().Present() {
				return usagef("admit takes node names or peer IDs, or --all-pending")
			}
			res, err := client(c).Admit(c.Context, c.Args().Slice(), all)
			if err != nil {
				return err
			}
			return printAdmissions(c, res)
		},
	}
}

func revokeCommand() *cli.Command {
	return &cli.Command{
		Name:      "revoke",
		Usage:     "revoke nodes' admission (trusted writers only): their records and memberships stop counting",
		ArgsUsage: "NODE...",
		Action: func(c *cli.Context) error {
			if !c.Args().Present() {
				return usagef("revoke takes node names or peer IDs")
			}
			res, err := client(c).Revoke(c.Context, c.Args().Slice())
			if err != nil {
				return err
			}
			return printAdmissions(c, res)
		},
	}
}

func printAdmissions(c *cli.Context, res []api.Admission) error {
	if flagBool(c, "json") {
		return printJSON(c.App.Writer, res)
	}
	if len(res) == 0 {
		fmt.Fprintln(c.App.Writer, "no pending nodes")
		return nil
	}
	tw := table(c.App.Writer)
	fmt.Fprintln(tw, "NAME\tID\tADMISSION\tNOTE")
	for _, a := range res {
		row(tw, a.Name, a.ID, a.Admission, oneLine(a.Error))
	}
	return tw.Flush()
}
