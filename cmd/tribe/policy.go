package main

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/urfave/cli/v2"
)

func factsCommand() *cli.Command {
	return &cli.Command{
		Name:      "facts",
		Usage:     "show a node's facts from the replicated state (this node's by default)",
		ArgsUsage: "[NODE]",
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return usagef("facts takes at most one node")
			}
			facts, err := client(c).Facts(c.Context, c.Args().First())
			if err != nil {
				return err
			}
			if flagBool(c, "json") {
				return printJSON(c.App.Writer, facts)
			}
			tw := table(c.App.Writer)
			for _, k := range slices.Sorted(mapKeys(facts)) {
				v, _ := json.Marshal(facts[k])
				row(tw, k, string(v))
			}
			return tw.Flush()
		},
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func policyCommand() *cli.Command {
	return &cli.Command{
		Name:  "policy",
		Usage: "manage policies: CEL expressions over facts that put matching nodes in a tribe",
		Subcommands: []*cli.Command{
			{
				Name:      "create",
				Usage:     "create or replace a policy; the expression is checked here and refused with CEL's message",
				ArgsUsage: "NAME EXPR",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "tribe", Required: true, Usage: "the tribe matching nodes join (created if it does not exist)"},
				},
				Action: func(c *cli.Context) error {
					if c.NArg() != 2 {
						return usagef("policy create takes a name and an expression, e.g. tribe policy create storage --tribe storage 'facts.storage_tier == true'")
					}
					p, err := client(c).CreatePolicy(c.Context, c.Args().Get(0), c.String("tribe"), c.Args().Get(1))
					if err != nil {
						return err
					}
					if flagBool(c, "json") {
						return printJSON(c.App.Writer, p)
					}
					fmt.Fprintf(c.App.Writer, "policy %s: nodes where %s join tribe %s\n", p.Name, p.Expr, p.Tribe)
					return nil
				},
			},
			{
				Name:  "list",
				Usage: "list the policies",
				Action: func(c *cli.Context) error {
					if err := noArgs(c); err != nil {
						return err
					}
					ps, err := client(c).Policies(c.Context)
					if err != nil {
						return err
					}
					if flagBool(c, "json") {
						return printJSON(c.App.Writer, ps)
					}
					tw := table(c.App.Writer)
					fmt.Fprintln(tw, "POLICY\tTRIBE\tEXPR\tERROR")
					for _, p := range ps {
						row(tw, p.Name, p.Tribe, oneLine(p.Expr), oneLine(p.Error))
					}
					return tw.Flush()
				},
			},
			{
				Name:      "delete",
				Usage:     "delete a policy; its members leave the tribe",
				ArgsUsage: "NAME",
				Action: func(c *cli.Context) error {
					name, err := oneArg(c, "the policy")
					if err != nil {
						return err
					}
					p, err := client(c).DeletePolicy(c.Context, name)
					if err != nil {
						return err
					}
					if flagBool(c, "json") {
						return printJSON(c.App.Writer, p)
					}
					fmt.Fprintf(c.App.Writer, "deleted policy %s\n", name)
					return nil
				},
			},
			{
				Name:      "test",
				Usage:     "show which nodes of the fleet match an expression now, and why any cannot be evaluated",
				ArgsUsage: "EXPR",
				Action: func(c *cli.Context) error {
					expr, err := oneArg(c, "the expression")
					if err != nil {
						return err
					}
					ms, err := client(c).TestPolicy(c.Context, expr)
					if err != nil {
						return err
					}
					if flagBool(c, "json") {
						return printJSON(c.App.Writer, ms)
					}
					tw := table(c.App.Writer)
					fmt.Fprintln(tw, "NAME\tID\tMATCH\tERROR")
					matched := 0
					for _, m := range ms {
						if m.Match {
							matched++
						}
						row(tw, m.Name, m.ID, m.Match, oneLine(m.Error))
					}
					tw.Flush()
					fmt.Fprintf(c.App.Writer, "%d of %d nodes match\n", matched, len(ms))
					return nil
				},
			},
		},
	}
}
