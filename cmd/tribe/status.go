package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/tribeagent/tribe/node/api"
)

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show the local agent: id, name, addresses, peer count",
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			s, err := client(c).Status(c.Context)
			if err != nil {
				return err
			}
			if flagBool(c, "json") {
				return printJSON(c.App.Writer, s)
			}
			tw := table(c.App.Writer)
			row(tw, "id", s.ID)
			row(tw, "name", s.Name)
			row(tw, "cluster", s.Cluster)
			row(tw, "version", s.Version)
			fmt.Fprintf(tw, "peers\t%d\n", s.Peers)
			fmt.Fprintf(tw, "mdns\t%v\n", s.MDNS)
			fmt.Fprintf(tw, "private network\t%v\n", s.Private)
			if s.Trust == "open" {
				fmt.Fprintf(tw, "trust\topen: every peer that can connect may write tribe state and call every plugin\n")
			} else {
				fmt.Fprintf(tw, "trust\t%d trusted writers: %s\n", len(s.Trusted), strings.Join(s.Trusted, ", "))
				fmt.Fprintf(tw, "admission\t%s\n", s.Admission)
				if s.Pending > 0 {
					fmt.Fprintf(tw, "pending\t%d nodes wait for admission (tribe nodes --pending, tribe admit)\n", s.Pending)
				}
			}
			fmt.Fprintf(tw, "state\t%d entries, hash %.16s\n", s.Entries, s.StateHash)
			if c := nonZero(s.Rejected); c != "" {
				fmt.Fprintf(tw, "rejected\t%s\n", c)
			}
			if c := nonZero(s.Dropped); c != "" {
				fmt.Fprintf(tw, "dropped under load\t%s\n", c)
			}
			for _, j := range s.Joins {
				row(tw, "join "+j.Addr, joinText(j))
			}
			fmt.Fprintf(tw, "uptime\t%s\n", s.Uptime.Round(time.Second))
			fmt.Fprintf(tw, "data dir\t%s\n", s.DataDir)
			if s.MetricsAddr != "" {
				fmt.Fprintf(tw, "metrics\thttp://%s/metrics, health http://%s/healthz\n", s.MetricsAddr, s.MetricsAddr)
			}
			for i, a := range s.Addrs {
				label := ""
				if i == 0 {
					label = "addrs"
				}
				row(tw, label, a)
			}
			return tw.Flush()
		},
	}
}

func peersCommand() *cli.Command {
	return &cli.Command{
		Name:  "peers",
		Usage: "list the connected peers of this cluster",
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			peers, err := client(c).Peers(c.Context)
			if err != nil {
				return err
			}
			if flagBool(c, "json") {
				return printJSON(c.App.Writer, peers)
			}
			tw := table(c.App.Writer)
			fmt.Fprintln(tw, "NAME\tID\tADDRS")
			for _, p := range peers {
				row(tw, p.Name, p.ID, strings.Join(stripP2P(p.Addrs), " "))
			}
			return tw.Flush()
		},
	}
}

// stripP2P drops the /p2p/<id> suffix where the ID is shown in its own column.
func stripP2P(addrs []string) []string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		if j := strings.Index(a, "/p2p/"); j > 0 {
			a = a[:j]
		}
		out[i] = a
	}
	return out
}

// nonZero lists the counters above zero as "name n, ...", sorted.
func nonZero(counts map[string]int64) string {
	var out []string
	for name, n := range counts {
		if n > 0 {
			out = append(out, fmt.Sprintf("%s %d", name, n))
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// joinText says how a --join address fares, and what to do if it fails.
func joinText(j api.Join) string {
	switch j.State {
	case api.JoinJoined:
		return "joined " + j.ID
	case api.JoinOtherCluster:
		return fmt.Sprintf("peer %s belongs to cluster %q, not this one: check --cluster on both hosts", j.ID, j.Cluster)
	case api.JoinUnreachable:
		return "unreachable, retrying: " + j.Error
	case api.JoinSelf:
		return "this node's own address: ignored"
	case api.JoinDone:
		return "took this node in (" + j.ID + "); not connected now, dialled again if short of peers"
	}
	return j.State
}
