package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/node/api"
)

func nodesCommand() *cli.Command {
	return &cli.Command{
		Name:  "nodes",
		Usage: "list the fleet's nodes from the replicated state, with liveness",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "where", Usage: "only nodes whose facts match this CEL expression, e.g. 'facts.cpu_count >= 8'"},
			&cli.BoolFlag{Name: "pending", Usage: "only the nodes waiting for a trusted writer to admit them"},
			&cli.StringSliceFlag{Name: "status", Usage: "only nodes in this state: alive, suspect, dead or left; repeatable"},
			&cli.BoolFlag{Name: "detailed", Usage: "with each node's facts"},
		},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			statuses := c.StringSlice("status")
			for _, s := range statuses {
				if !slices.Contains(nodeStatuses, s) {
					return usagef("--status %q: use alive, suspect, dead or left", s)
				}
			}
			get := client(c).Nodes
			if c.Bool("detailed") {
				get = client(c).NodesWithFacts
			}
			nodes, err := get(c.Context, c.String("where"))
			if err != nil {
				return err
			}
			nodes = filterNodes(nodes, c.Bool("pending"), statuses)
			if flagBool(c, "json") {
				return printJSON(c.App.Writer, nodes)
			}
			return printNodes(c.App.Writer, nodes, c.Bool("detailed"))
		},
	}
}

// nodeStatuses are the liveness states --status takes.
var nodeStatuses = []string{"alive", "suspect", "dead", "left"}

// filterNodes keeps the pending nodes (if pending) in one of statuses (if
// any).
func filterNodes(nodes []api.Node, pending bool, statuses []string) []api.Node {
	return slices.DeleteFunc(nodes, func(n api.Node) bool {
		return pending && n.Admission != "pending" || len(statuses) > 0 && !slices.Contains(statuses, n.Liveness)
	})
}

// printNodes prints one line per node: its first address (more are in
// --json), and with detailed its facts as k=v, sorted, as serf's members
// -detailed prints tags.
func printNodes(w io.Writer, nodes []api.Node, detailed bool) error {
	tw := table(w)
	header := "NAME\tID\tADDRESS\tSTATUS\tADMISSION\tVERSION"
	if detailed {
		header += "\tFACTS"
	}
	fmt.Fprintln(tw, header)
	for _, n := range nodes {
		self := ""
		if n.Self {
			self = " (this node)"
		}
		addr := "-"
		if as := stripP2P(n.Addrs); len(as) > 0 {
			addr = as[0]
			if len(as) > 1 {
				addr += fmt.Sprintf(" (+%d)", len(as)-1)
			}
		}
		cells := []any{names.Shown(n.Name) + self, n.ID, addr, n.Liveness, n.Admission, n.Version}
		if detailed {
			cells = append(cells, factsLine(n.Facts))
		}
		row(tw, cells...)
	}
	return tw.Flush()
}

// factsLine is facts as k=v,k=v sorted by key; text as is, other values as
// compact JSON.
func factsLine(facts map[string]any) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(facts)) {
		v, ok := facts[k].(string)
		if !ok {
			b, _ := json.Marshal(facts[k])
			v = string(b)
		}
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

// oneArg returns the command's single argument, named what.
func oneArg(c *cli.Context, what string) (string, error) {
	if c.NArg() != 1 {
		return "", usagef("%s takes one argument, %s; got %d", c.Command.Name, what, c.NArg())
	}
	return c.Args().First(), nil
}

func tribeCommands() []*cli.Command {
	return []*cli.Command{
		{
			Name:      "list",
			Usage:     "list the tribes and their member counts",
			ArgsUsage: " ",
			Action: func(c *cli.Context) error {
				if err := noArgs(c); err != nil {
					return err
				}
				tribes, err := client(c).Tribes(c.Context)
				if err != nil {
					return err
				}
				if flagBool(c, "json") {
					return printJSON(c.App.Writer, tribes)
				}
				tw := table(c.App.Writer)
				fmt.Fprintln(tw, "TRIBE\tMEMBERS")
				for _, t := range tribes {
					row(tw, t.Name, t.Members)
				}
				return tw.Flush()
			},
		},
		{
			Name:      "show",
			Usage:     "show a tribe: members, policies, plugins",
			ArgsUsage: "TRIBE",
			Action: func(c *cli.Context) error {
				t, err := fetchTribe(c)
				if err != nil {
					return err
				}
				return printTribe(c, t)
			},
		},
		{
			Name:      "members",
			Usage:     "list a tribe's members, how they joined (via) and whether they are alive",
			ArgsUsage: "TRIBE",
			Action: func(c *cli.Context) error {
				t, err := fetchTribe(c)
				if err != nil {
					return err
				}
				return printMembers(c, t.Members)
			},
		},
		{
			Name:      "create",
			Usage:     "create a tribe (needs a trusted writer); returns once stored",
			ArgsUsage: "TRIBE",
			Action: func(c *cli.Context) error {
				name, err := oneArg(c, "the tribe")
				if err != nil {
					return err
				}
				t, err := client(c).CreateTribe(c.Context, name)
				if err != nil {
					return err
				}
				return printTribe(c, t)
			},
		},
		{
			Name:      "delete",
			Usage:     "delete a tribe: its metadata, manual memberships, plugins and tasks (refused while a policy names it)",
			ArgsUsage: "TRIBE",
			Action: func(c *cli.Context) error {
				name, err := oneArg(c, "the tribe")
				if err != nil {
					return err
				}
				t, err := client(c).DeleteTribe(c.Context, name)
				if err != nil {
					return err
				}
				if flagBool(c, "json") {
					return printJSON(c.App.Writer, t)
				}
				fmt.Fprintf(c.App.Writer, "deleted tribe %s (%d members, %d plugins)\n", name, len(t.Members), len(t.Plugins))
				return nil
			},
		},
		{
			Name:      "join",
			Usage:     "add nodes (names or peer IDs) to a tribe by hand",
			ArgsUsage: "TRIBE NODE...",
			Action: func(c *cli.Context) error {
				return membership(c, (*api.Client).Join)
			},
		},
		leaveCommand(),
	}
}

// fetchTribe gets the tribe named by the command's one argument.
func fetchTribe(c *cli.Context) (api.Tribe, error) {
	name, err := oneArg(c, "the tribe")
	if err != nil {
		return api.Tribe{}, err
	}
	return client(c).Tribe(c.Context, name)
}

type membershipCall func(*api.Client, context.Context, string, []string) ([]api.Member, error)

func membership(c *cli.Context, call membershipCall) error {
	if c.NArg() < 2 {
		return usagef("%s takes a tribe and at least one node", c.Command.Name)
	}
	members, err := call(client(c), c.Context, c.Args().First(), c.Args().Tail())
	if err != nil {
		return err
	}
	return printMembers(c, members)
}

func printTribe(c *cli.Context, t api.Tribe) error {
	if flagBool(c, "json") {
		return printJSON(c.App.Writer, t)
	}
	tw := table(c.App.Writer)
	row(tw, "tribe", t.Name)
	row(tw, "policies", strings.Join(t.Policies, ", "))
	row(tw, "plugins", strings.Join(t.Plugins, ", "))
	row(tw, "members", len(t.Members))
	tw.Flush()
	if len(t.Members) == 0 {
		return nil
	}
	fmt.Fprintln(c.App.Writer)
	return printMembers(c, t.Members)
}

func printMembers(c *cli.Context, members []api.Member) error {
	if flagBool(c, "json") {
		return printJSON(c.App.Writer, members)
	}
	tw := table(c.App.Writer)
	fmt.Fprintln(tw, "NAME\tID\tALIVE\tVIA")
	for _, m := range members {
		row(tw, m.Name, m.ID, m.Alive, strings.Join(m.Via, ","))
	}
	return tw.Flush()
}
