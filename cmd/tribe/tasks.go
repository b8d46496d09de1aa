package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/node/api"
)

func taskCommand() *cli.Command {
	oneName := func(verb string) func(c *cli.Context) error {
		return func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usagef("task %s takes one task name", verb)
			}
			return nil
		}
	}
	return &cli.Command{
		Name:  "task",
		Usage: "schedules of plugin calls (collect, process, publish) that every member of a tribe runs",
		Description: `A task is a manifest (YAML or JSON): a name, a schedule (interval: 10s, or
cron: "*/5 * * * *" in UTC; optional start, stop, count and splay) and a
workflow: one collect step, then process steps, then publish steps, each a
plugin, method and args; the output of a step is the input of the next, and
every publish step gets the last output. A publish step with tribe: NAME
sends it to one member of that tribe instead. Every member of the tribe runs
the task with the plugins it loaded there; max_failures (default 10) failed
runs in a row disable it on a member. See the README's Tasks section.`,
		Subcommands: []*cli.Command{
			{
				Name:  "create",
				Usage: "check a task manifest and write it for a tribe (trusted writers only)",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "tribe", Required: true, Usage: "the tribe whose members run it"},
					&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Required: true, Usage: "the manifest, YAML or JSON (- for standard input)"},
				},
				Action: func(c *cli.Context) error {
					if err := noArgs(c); err != nil {
						return err
					}
					var b []byte
					var err error
					if f := c.String("file"); f == "-" {
						b, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
					} else {
						b, err = os.ReadFile(f)
					}
					if err != nil {
						return fmt.Errorf("task manifest: %w", err)
					}
					t, err := client(c).CreateTask(c.Context, c.String("tribe"), string(b))
					if err != nil {
						return err
					}
					if flagBool(c, "json") {
						return printJSON(c.App.Writer, t)
					}
					fmt.Fprintf(c.App.Writer, "created task %s in tribe %s\n", t.Name, t.Tribe)
					return nil
				},
			},
			{
				Name:  "list",
				Usage: "list the tasks of every tribe, or of one",
				Flags: []cli.Flag{&cli.StringFlag{Name: "tribe", Usage: "only this tribe's tasks"}},
				Action: func(c *cli.Context) error {
					if err := noArgs(c); err != nil {
						return err
					}
					ts, err := client(c).Tasks(c.Context, c.String("tribe"))
					if err != nil {
						return err
					}
					if flagBool(c, "json") {
						return printJSON(c.App.Writer, ts)
					}
					tw := table(c.App.Writer)
					fmt.Fprintln(tw, "TASK\tTRIBE\tSCHEDULE\tSTATE\tMEMBERS")
					for _, t := range ts {
						row(tw, t.Name, t.Tribe, scheduleText(t.Schedule), taskState(t), len(t.Members))
					}
					return tw.Flush()
				},
			},
			{
				Name:      "show",
				Usage:     "a task and how it goes on each member (from their records: no call is made)",
				ArgsUsage: "NAME",
				Before:    oneName("show"),
				Action: func(c *cli.Context) error {
					t, err := client(c).Task(c.Context, c.Args().First())
					if err != nil {
						return err
					}
					if flagBool(c, "json") {
						return printJSON(c.App.Writer, t)
					}
					fmt.Fprintf(c.App.Writer, "task %s in tribe %s, %s, %s\n", t.Name, t.Tribe, scheduleText(t.Schedule), taskState(t))
					tw := table(c.App.Writer)
					fmt.Fprintln(tw, "MEMBER\tSTATE\tRUNS\tFAILURES\tLAST RUN\tLAST MS\tERROR")
					for _, m := range t.Members {
						last := "-"
						if !m.LastRun.IsZero() {
							last = m.LastRun.Local().Format(time.TimeOnly)
						}
						row(tw, m.Name, m.State, m.Runs, m.Failures, last, m.LastMS, oneLine(m.Error))
					}
					return tw.Flush()
				},
			},
			{
				Name:      "watch",
				Usage:     "stream each run of a task on every member as it ends, until Ctrl-C",
				ArgsUsage: "NAME",
				Description: `One row per run: time, member, run number, ok or the error, duration and the
head of the output (at most 1 KiB); with --json one object per line {time,
task, tribe, id, name, run, ok, ms, error, output}. The agent opens a stream
to every member of the tribe when the watch starts (members that join later
are not watched); a member serves at most 64 watchers.`,
				Before: oneName("watch"),
				Action: func(c *cli.Context) error {
					ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
					defer stop()
					asJSON := flagBool(c, "json")
					enc := jsonEncoder(c.App.Writer)
					name := c.Args().First()
					ready := func() { fmt.Fprintf(c.App.ErrWriter, "watching task %s; Ctrl-C to stop\n", name) }
					return client(c).WatchTask(ctx, name, ready, func(r api.TaskRun) {
						if asJSON {
							enc.Encode(r)
							return
						}
						result := "ok"
						if !r.OK {
							result = "error: " + oneLine(r.Error)
						}
						// The member's name, error and output as a table's cells (see row).
						fmt.Fprintf(c.App.Writer, "%s %s run=%d %s %dms %s\n", r.Time.Local().Format("15:04:05.000"), names.Shown(r.Name), r.Run,
							names.Shown(result), r.MS, names.Shown(oneLine(string(r.Output))))
					})
				},
			},
			taskToggle("stop", "stop a task on every member (trusted writers only); it keeps its runs count", true, oneName("stop")),
			taskToggle("start", "start a stopped or disabled task again on every member (trusted writers only)", false, oneName("start")),
			{
				Name:      "delete",
				Usage:     "delete a task: every member stops it (trusted writers only)",
				ArgsUsage: "NAME",
				Before:    oneName("delete"),
				Action: func(c *cli.Context) error {
					t, err := client(c).DeleteTask(c.Context, c.Args().First())
					if err != nil {
						return err
					}
					if flagBool(c, "json") {
						return printJSON(c.App.Writer, t)
					}
					fmt.Fprintf(c.App.Writer, "deleted task %s of tribe %s\n", t.Name, t.Tribe)
					return nil
				},
			},
		},
	}
}

func taskToggle(verb, usage string, stopped bool, before cli.BeforeFunc) *cli.Command {
	return &cli.Command{
		Name:      verb,
		Usage:     usage,
		ArgsUsage: "NAME",
		Before:    before,
		Action: func(c *cli.Context) error {
			t, err := client(c).SetTaskStopped(c.Context, c.Args().First(), stopped)
			if err != nil {
				return err
			}
			if flagBool(c, "json") {
				return printJSON(c.App.Writer, t)
			}
			past := map[bool]string{true: "stopped", false: "started"}[stopped]
			fmt.Fprintf(c.App.Writer, "%s task %s of tribe %s\n", past, t.Name, t.Tribe)
			return nil
		},
	}
}

// scheduleText is a schedule in a few words.
func scheduleText(raw json.RawMessage) string {
	var s struct {
		Interval string `json:"interval"`
		Cron     string `json:"cron"`
		Count    int    `json:"count"`
		Splay    string `json:"splay"`
	}
	json.Unmarshal(raw, &s)
	out := "every " + s.Interval
	if s.Cron != "" {
		out = "cron " + s.Cron
	}
	if s.Count > 0 {
		out += fmt.Sprintf(", %d runs", s.Count)
	}
	if s.Splay != "" && s.Splay != "0s" {
		out += ", splay " + s.Splay
	}
	return out
}

func taskState(t api.Task) string {
	if t.Stopped {
		return "stopped"
	}
	return "started"
}
