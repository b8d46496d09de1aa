package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/tribeagent/tribe/node/api"
)

func nodesCommand() *cli.Command {
	return &cli.Command{
		Name:  "nodes",
		Usage: "list the fleet's nodes from the replicated state, with liveness",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "where", Usage: "only nodes whose facts match this CEL expression, e.g. 'facts.cpu_count >= 8'"},
			&cli.BoolFlag{Name: "pending", Usage: "only the nodes waiting for a trusted writer to admit them"},
		},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			nodes, err := client(c).Nodes(c.Context, c.String("where"))
			if err != nil {
				return err
			}
			if c.Bool("pending") {
				nodes = slices.DeleteFunc(nodes, func(n api.Node) bool { return n.Admission != "pending" })
			}
			if flagBool(c, "json") {
				return printJSON(c.App.Writer, nodes)
			}
			tw := table(c.App.Writer)
			fmt.Fprintln(tw, "NAME\tID\tLIVENESS\tADMISSION\tVERSION")
			for _, n := range nodes {
				name := n.Name
				if n.Self {
					name += " (this node)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", name, n.ID, n.Liveness, n.Admission, n.Version)
			}
			return tw.Flush()
		},
	}
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
					fmt.Fprintf(tw, "%s\t%d\n", t.Name, t.Members)
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
	fmt.Fprintf(tw, "tribe\t%s\n", t.Name)
	fmt.Fprintf(tw, "policies\t%s\n", strings.Join(t.Policies, ", "))
	fmt.Fprintf(tw, "plugins\t%s\n", strings.Join(t.Plugins, ", "))
	fmt.Fprintf(tw, "members\t%d\n", len(t.Members))
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
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\n", m.Name, m.ID, m.Alive, strings.Join(m.Via, ","))
	}
	return tw.Flush()
}
