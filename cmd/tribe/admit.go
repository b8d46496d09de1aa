package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/tribeagent/tribe/node"
	"github.com/tribeagent/tribe/node/api"
)

func admitCommand() *cli.Command {
	return &cli.Command{
		Name:      "admit",
		Usage:     "admit nodes (trusted writers only): their records and memberships count from now on",
		ArgsUsage: "NODE... | --all-pending | PEERID --name NAME",
		Description: `With --trusted set, a node's own entries count only once a trusted writer
has admitted it; until then it is listed as pending (tribe nodes --pending)
and can neither call nor be called. NODE is a name or a peer ID. The
node is admitted under the name its record carries, and from then on
answers to that name; a name another admitted node holds, even one that
is down, is refused (start the new node with another --name, or revoke
the holder). Admitting a node again binds the name its record carries
now. --all-pending admits every pending node whose name is free; revoked
nodes are not pending and stay revoked.

PEERID --name NAME admits one node by its peer ID under NAME, whether or
not its record has arrived: a host admitted before its first start (tribe
id on that host prints its peer ID, and makes its identity if need be), or
one whose record this agent does not hold because records of nodes that
do not count are bounded (1,024 held), which anyone can fill.`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "all-pending", Usage: "admit every pending node"},
			&cli.StringFlag{Name: "name", Usage: "admit the one node given by peer ID under this name, whether or not its record has arrived"},
		},
		Action: func(c *cli.Context) error {
			all := c.Bool("all-pending")
			if all == c.Args().Present() {
				return usagef("admit takes node names or peer IDs, or --all-pending")
			}
			req := api.AdmitRequest{Nodes: c.Args().Slice(), AllPending: all, Name: c.String("name")}
			if c.IsSet("name") && (req.Name == "" || all || c.NArg() != 1) {
				return usagef("--name takes a name and admits one node, given by its peer ID")
			}
			res, err := client(c).Admit(c.Context, req)
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

// idInfo is what `tribe id --json` prints.
type idInfo struct {
	ID      string `json:"id"`
	Created bool   `json:"created"`
}

func idCommand() *cli.Command {
	return &cli.Command{
		Name:  "id",
		Usage: "print this host's peer ID, making its identity in the data dir if it has none, without starting the agent",
		Description: `Reads the identity key in the data dir (a running agent's too), or makes
one when there is none, so that a host's peer ID is known before its
first start: admit it ahead on a trusted writer (tribe admit PEERID
--name NAME) and it counts from its first record, or list it in other
agents' --trusted. --json prints {id, created}.`,
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			id, created, err := node.Identity(flagString(c, "data-dir"))
			if err != nil {
				return err
			}
			if flagBool(c, "json") {
				return printJSON(c.App.Writer, idInfo{ID: id.String(), Created: created})
			}
			_, err = fmt.Fprintln(c.App.Writer, id)
			return err
		},
	}
}
