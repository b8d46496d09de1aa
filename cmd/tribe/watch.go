package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/node/api/events"
)

func watchCommand() *cli.Command {
	return &cli.Command{
		Name:  "watch",
		Usage: "stream the fleet's events as they happen, until Ctrl-C",
		Description: `Prints one line per event as this agent sees it: node-joined, node-alive,
node-suspect, node-dead (node-<liveness> for any liveness), tribe-created,
tribe-deleted, member-added, member-changed, member-removed (with via),
policy-created, policy-updated, policy-deleted, plugin-loaded,
plugin-updated, plugin-unloaded, plugin-state (one member's loading state),
admission, and dropped (this watcher fell behind and lost that many events).
With --json, one JSON object per line. --prefix keeps only the events whose
state key starts with it (liveness events carry nodes/<peer>).`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "prefix", Usage: "only events of state keys under this prefix, e.g. tribes/core/ or nodes/"},
		},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
			defer stop()
			asJSON := flagBool(c, "json")
			enc := jsonEncoder(c.App.Writer)
			ready := func() { fmt.Fprintln(c.App.ErrWriter, "watching events; Ctrl-C to stop") }
			return client(c).Watch(ctx, c.String("prefix"), ready, func(e events.Event) {
				if asJSON {
					enc.Encode(e)
					return
				}
				printEvent(c.App.Writer, e)
			})
		},
	}
}

// printEvent writes e as one line: time, type, then the fields it has.
func printEvent(w io.Writer, e events.Event) {
	var b strings.Builder
	b.WriteString(e.Time.Local().Format("2006-01-02T15:04:05.000Z07:00"))
	b.WriteString(" " + e.Type)
	field := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&b, " %s=%s", k, quoteIfNeeded(v))
		}
	}
	field("name", e.Name)
	field("tribe", e.Tribe)
	field("plugin", e.Plugin)
	field("via", strings.Join(e.Via, ","))
	field("state", e.State)
	field("from", e.From)
	field("version", e.Version)
	field("expr", e.Expr)
	field("error", e.Error)
	if e.Count != 0 {
		field("count", fmt.Sprint(e.Count))
	}
	field("node", e.Node)
	fmt.Fprintln(w, b.String())
}

func quoteIfNeeded(s string) string {
	if strings.ContainsAny(s, " \"=") || !names.Printable(s) {
		return fmt.Sprintf("%q", s)
	}
	return s
}
