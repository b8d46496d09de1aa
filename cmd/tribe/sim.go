package main

import (
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/tribeagent/tribe/sim"
)

func simCommand() *cli.Command {
	return &cli.Command{
		Name:  "sim",
		Usage: "run a simulated cluster of real nodes in this process and print what it measured",
		Description: `Builds --nodes real tribe nodes on libp2p's mock network (no sockets, no
multicast), each told to --join one random earlier node, and runs a scenario:
  connect    start every node; measure the time until each has --min-peers peers
             and the heap per node
  partition  connect, then split the cluster in two halves, check that no
             connection crosses, heal, and measure the time to reconnect`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "nodes", Value: 50, Usage: "number of nodes"},
			&cli.StringFlag{Name: "scenario", Value: "connect", Usage: fmt.Sprintf("one of %v", sim.Scenarios)},
			&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed for topology, keys and randomness"},
			&cli.DurationFlag{Name: "latency", Usage: "latency of every link (e.g. 10ms)"},
			&cli.IntFlag{Name: "min-peers", Value: 3, Usage: "peers every node must reach"},
			&cli.DurationFlag{Name: "timeout", Value: 5 * time.Minute, Usage: "give up after this long"},
			&cli.BoolFlag{Name: "verbose", Usage: "print the nodes' logs"},
		},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			if c.Int("nodes") < 1 {
				return usagef("--nodes must be at least 1")
			}
			if !slices.Contains(sim.Scenarios, c.String("scenario")) {
				return usagef("--scenario %q: use one of %v", c.String("scenario"), sim.Scenarios)
			}
			cfg := sim.Config{Nodes: c.Int("nodes"), Seed: c.Uint64("seed"), Latency: c.Duration("latency")}
			if c.Bool("verbose") {
				cfg.Logger = slog.New(slog.NewTextHandler(c.App.ErrWriter, nil))
			}
			minPeers := min(c.Int("min-peers"), c.Int("nodes")-1)
			r, err := sim.RunScenario(c.Context, c.String("scenario"), cfg, minPeers, c.Duration("timeout"))
			if err != nil {
				return err
			}
			if flagBool(c, "json") {
				return printJSON(c.App.Writer, r)
			}
			tw := table(c.App.Writer)
			fmt.Fprintf(tw, "scenario\t%s (seed %d, latency %s)\n", r.Scenario, r.Seed, r.Latency)
			fmt.Fprintf(tw, "nodes up\t%d of %d\n", r.NodesUp, r.Nodes)
			fmt.Fprintf(tw, "every node >= %d peers after\t%.0f ms\n", r.MinPeers, r.ConnectMS)
			fmt.Fprintf(tw, "heap per node\t%.1f KiB (mock network: %.1f MiB more)\n", float64(r.HeapPerNodeBytes)/1024, float64(r.MocknetHeapBytes)/(1<<20))
			if r.Scenario == "partition" {
				fmt.Fprintf(tw, "healed after\t%.0f ms\n", r.HealMS)
			}
			return tw.Flush()
		},
	}
}
