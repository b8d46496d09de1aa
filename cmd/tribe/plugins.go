package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/node/api"
)

func pluginCommand() *cli.Command {
	tribeFlag := &cli.StringFlag{Name: "tribe", Required: true, Usage: "the tribe whose members load or unload it"}
	return &cli.Command{
		Name:  "plugin",
		Usage: "load plugins on every member of a tribe, unload them, list them",
		Subcommands: []*cli.Command{
			{
				Name:  "list",
				Usage: "list the plugins loaded in tribes and how loading went on each member",
				Flags: []cli.Flag{&cli.StringFlag{Name: "tribe", Usage: "only this tribe's plugins"}},
				Action: func(c *cli.Context) error {
					if err := noArgs(c); err != nil {
						return err
					}
					ps, err := client(c).Plugins(c.Context, c.String("tribe"))
					if err != nil {
						return err
					}
					if flagBool(c, "json") {
						return printJSON(c.App.Writer, ps)
					}
					tw := table(c.App.Writer)
					fmt.Fprintln(tw, "TRIBE\tPLUGIN\tCALLERS\tNODE\tSTATE\tSOURCE\tVERSION\tERROR")
					for _, p := range ps {
						callers := "trusted"
						if len(p.Callers) > 0 {
							callers += "," + strings.Join(p.Callers, ",")
						}
						if len(p.Nodes) == 0 {
							row(tw, p.Tribe, p.Name, callers, "-", "no members", "", "", "")
						}
						for _, n := range p.Nodes {
							row(tw, p.Tribe, p.Name, callers, n.Name, n.State, n.Source, n.Version, oneLine(n.Error))
						}
					}
					return tw.Flush()
				},
			},
			{
				Name:      "load",
				Usage:     "load a plugin on every member of a tribe (members that join later load it too)",
				ArgsUsage: "NAME",
				Description: `Trusted writers may always call it. Who else may is granted with --callers:
  members       members of the tribe it is loaded in
  tribe:NAME    members of tribe NAME
  admitted      every admitted node
Without --callers only trusted writers may call it. A membership counts
only for an admitted node, and a policy membership only while that policy
exists, names the tribe and matches the node's facts.`,
				Flags: []cli.Flag{tribeFlag,
					&cli.StringSliceFlag{Name: "config", Usage: "plugin setting key=value, repeatable (every plugin takes concurrency and queue; exec: timeout, max_output; file: path, max_bytes; sys: paths)"},
					&cli.StringSliceFlag{Name: "callers", Usage: "who besides trusted writers may call it: members, tribe:NAME or admitted, repeatable (default: trusted writers only)"}},
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usagef("plugin load takes one plugin name (built-ins: exec, sys, facts, echo, file)")
					}
					config := map[string]string{}
					for _, kv := range c.StringSlice("config") {
						k, v, ok := strings.Cut(kv, "=")
						if !ok || k == "" {
							return usagef("--config %q: want key=value", kv)
						}
						config[k] = v
					}
					p, err := client(c).LoadPlugin(c.Context, c.Args().First(), c.String("tribe"), api.LoadRequest{Config: config, Callers: c.StringSlice("callers")})
					if err != nil {
						return err
					}
					if flagBool(c, "json") {
						return printJSON(c.App.Writer, p)
					}
					fmt.Fprintf(c.App.Writer, "loading %s on the %d members of %s; see `tribe plugin list --tribe %s`\n", p.Name, len(p.Nodes), p.Tribe, p.Tribe)
					return nil
				},
			},
			{
				Name:      "add",
				Usage:     "share an external plugin's executable with a tribe: members that take shared plugins fetch, check and run it",
				ArgsUsage: "FILE",
				Description: `FILE is a plugin executable on this agent's host, named as the plugin (see
the README, "Write a plugin"). The agent starts it once to check that it
is one, keeps a copy, and writes the plugin's entry with its version,
sha256 and size. Each member started with --accept-plugins trusted fetches
the bytes from a peer that has them, refuses them unless their sha256 is
the entry's, installs them in its plugin dir (shared/<sha256>/NAME) and
loads the plugin; every other member reports it "not installed here
(sharing is off)" and runs nothing. Trusted writers only; --callers as
for plugin load.`,
				Flags: []cli.Flag{tribeFlag,
					&cli.StringSliceFlag{Name: "callers", Usage: "who besides trusted writers may call it: members, tribe:NAME or admitted, repeatable (default: trusted writers only)"}},
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usagef("plugin add takes one file, the plugin's executable")
					}
					file, err := filepath.Abs(c.Args().First())
					if err != nil {
						return err
					}
					p, err := client(c).LoadPlugin(c.Context, filepath.Base(file), c.String("tribe"), api.LoadRequest{File: file, Callers: c.StringSlice("callers")})
					if err != nil {
						return err
					}
					if flagBool(c, "json") {
						return printJSON(c.App.Writer, p)
					}
					fmt.Fprintf(c.App.Writer, "sharing %s with the %d members of %s; see `tribe plugin list --tribe %s`\n", p.Name, len(p.Nodes), p.Tribe, p.Tribe)
					return nil
				},
			},
			{
				Name:      "unload",
				Usage:     "unload a plugin from every member of a tribe",
				ArgsUsage: "NAME",
				Flags:     []cli.Flag{tribeFlag},
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usagef("plugin unload takes one plugin name")
					}
					p, err := client(c).UnloadPlugin(c.Context, c.Args().First(), c.String("tribe"))
					if err != nil {
						return err
					}
					if flagBool(c, "json") {
						return printJSON(c.App.Writer, p)
					}
					fmt.Fprintf(c.App.Writer, "unloaded %s from %s\n", p.Name, p.Tribe)
					return nil
				},
			},
		},
	}
}

func callCommand() *cli.Command {
	return &cli.Command{
		Name:  "call",
		Usage: "call a plugin on every member of tribes and on named nodes at once; each node's answer is shown as it arrives",
		Description: `Every target answers, fails or times out: nothing is left out. The exit
status is 0 only if every target answered ok. With --json, each node's
result is one JSON object per line on stdout and the summary goes to stderr.

Examples:
  tribe call --tribe storage exec run '{"command":"uptime"}'
  tribe call --node web-1 --node web-2 --timeout 5s sys collect`,
		ArgsUsage: "PLUGIN METHOD [JSON]",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "tribe", Usage: "call every member of this tribe, repeatable"},
			&cli.StringSliceFlag{Name: "node", Usage: "call this node (name or peer ID), repeatable"},
			&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "how long to wait for the slowest node"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() < 2 || c.NArg() > 3 {
				return usagef("call takes PLUGIN METHOD [JSON], got %d arguments", c.NArg())
			}
			if len(c.StringSlice("tribe"))+len(c.StringSlice("node")) == 0 {
				return usagef("name whom to call: --tribe T or --node N, at least one")
			}
			req := api.CallRequest{Tribes: c.StringSlice("tribe"), Nodes: c.StringSlice("node"),
				Plugin: c.Args().Get(0), Method: c.Args().Get(1), Timeout: c.Duration("timeout")}
			if c.NArg() == 3 {
				args := []byte(c.Args().Get(2))
				if !json.Valid(args) {
					return usagef("the arguments %q are not valid JSON", c.Args().Get(2))
				}
				req.Args = args
			}
			asJSON := flagBool(c, "json")
			w := c.App.Writer
			tbl := callTable{w: w}
			sum, err := client(c).Call(c.Context, req, func(r api.CallResult) {
				if asJSON {
					jsonEncoder(w).Encode(r)
					return
				}
				tbl.row(r)
			})
			if err != nil {
				return err
			}
			if asJSON {
				jsonEncoder(c.App.ErrWriter).Encode(map[string]api.CallSummary{"summary": sum})
			} else {
				fmt.Fprintf(w, "%s: %d answered, %d failed, %d timed out in %.1f ms\n", plural(sum.Targets, "node"), sum.Answered, sum.Failed, sum.TimedOut, sum.MS)
			}
			if sum.Answered != sum.Targets {
				return fmt.Errorf("%d of %s did not answer ok", sum.Targets-sum.Answered, plural(sum.Targets, "node"))
			}
			return nil
		},
	}
}

// callTable prints call results as rows under a header that comes with the
// first row, so a call refused before any target answers (an unknown node)
// prints only its error.
type callTable struct {
	w      io.Writer
	header bool
}

func (t *callTable) row(r api.CallResult) {
	if !t.header {
		fmt.Fprintf(t.w, "%-24s %-14s %10s  %s\n", "NODE", "STATUS", "MS", "RESULT")
		t.header = true
	}
	printCallResult(t.w, r)
}

// plural is "1 node", "2 nodes".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// oneLine folds an error that spans lines (a dial error lists every address
// tried) into one, so it stays in its table row.
func oneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}

// printCallResult prints one node's answer on one line: the result as
// compact JSON, or the error (and any result that came with it).
func printCallResult(w io.Writer, r api.CallResult) {
	name := r.Name
	if name == "" {
		name = r.ID
	}
	status := "ok"
	if !r.OK {
		status = r.Code
		if status == "" {
			status = "failed"
		}
	}
	text := compact(r.Result)
	if !r.OK {
		text = oneLine(r.Error)
		if len(r.Result) > 0 {
			text += " " + compact(r.Result)
		}
	}
	// As a table's cells (see row): the name, the code and the answer
	// are the callee's.
	fmt.Fprintf(w, "%-24s %-14s %10.1f  %s\n", names.Shown(name), names.Shown(status), r.MS, names.Shown(text))
}

func compact(b json.RawMessage) string {
	if len(b) == 0 {
		return ""
	}
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return string(b)
	}
	return buf.String()
}
