package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/node/api"
)

func jobCommand() *cli.Command {
	oneID := func(verb string) func(c *cli.Context) error {
		return func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usagef("job %s takes one job id", verb)
			}
			return nil
		}
	}
	waitFlag := &cli.DurationFlag{Name: "timeout", Usage: "stop waiting after this long (exit 1 if targets are still pending); 0 waits until every target ends", DefaultText: "0"}
	return &cli.Command{
		Name:  "job",
		Usage: "durable plugin calls: every target runs it once, even a target that is down now, and you see where it stands on each",
		Description: `A job is a plugin call written into the replicated state with its targets
fixed: the members of each --tribe now, and each --node. Every target runs it
once when it sees it: at once if it is up, or when it comes back (before the
job expires) if it was down, partitioned or rebooting. Each target writes its
own signed ack (running, done, failed, interrupted, expired, dropped or
cancelled), so anyone can see where the job stands. A target that crashes
while it runs the job reports it interrupted and runs it again only with
--retries. Jobs of one tribe run one at a time, in the order they were
submitted, on each target (--parallel runs a job beside them). See the
README's Jobs section.

Examples:
  tribe job submit --tribe web exec run '{"command":"deploy"}'
  tribe job submit --tribe web --retries 2 --wait exec run '{"command":"restart"}'
  tribe job status 19ab3c5e2f1-a1b2c3d4`,
		Subcommands: []*cli.Command{
			{
				Name:      "submit",
				Usage:     "write a job for the members of tribes and named nodes; prints its id (trusted writers only)",
				ArgsUsage: "PLUGIN METHOD [JSON]",
				Flags: []cli.Flag{
					&cli.StringSliceFlag{Name: "tribe", Usage: "every member of this tribe now is a target, repeatable; the first is the job's queue"},
					&cli.StringSliceFlag{Name: "node", Usage: "this node (name or peer ID) is a target, repeatable"},
					&cli.DurationFlag{Name: "expires", Value: 24 * time.Hour, Usage: "a target that has not started the job by then never runs it (at most 720h)"},
					&cli.IntFlag{Name: "retries", Usage: "more attempts after a failed or interrupted one (0 to 10), with backoff from 1s"},
					&cli.BoolFlag{Name: "include-new", Usage: "nodes that join a --tribe before the job expires run it too"},
					&cli.BoolFlag{Name: "parallel", Usage: "run beside the tribe's queue instead of in its turn"},
					&cli.DurationFlag{Name: "timeout", Usage: "bound on one attempt", DefaultText: "30s"},
					&cli.BoolFlag{Name: "wait", Usage: "then follow it as `tribe job wait` does"},
				},
				Action: func(c *cli.Context) error {
					if c.NArg() < 2 || c.NArg() > 3 {
						return usagef("job submit takes PLUGIN METHOD [JSON], got %d arguments", c.NArg())
					}
					if len(c.StringSlice("tribe"))+len(c.StringSlice("node")) == 0 {
						return usagef("name the targets: --tribe T or --node N, at least one")
					}
					req := api.JobRequest{Tribes: c.StringSlice("tribe"), Nodes: c.StringSlice("node"),
						Plugin: c.Args().Get(0), Method: c.Args().Get(1), Expires: c.Duration("expires"),
						Retries: c.Int("retries"), IncludeNew: c.Bool("include-new"), Parallel: c.Bool("parallel"),
						Timeout: c.Duration("timeout")}
					if c.NArg() == 3 {
						args := []byte(c.Args().Get(2))
						if !json.Valid(args) {
							return usagef("the arguments %q are not valid JSON", c.Args().Get(2))
						}
						req.Args = args
					}
					j, err := client(c).SubmitJob(c.Context, req)
					if err != nil {
						return err
					}
					switch {
					case c.Bool("wait"):
						fmt.Fprintf(c.App.ErrWriter, "job %s: %s\n", j.ID, plural(j.Counts["pending"], "target"))
						return waitJob(c, j.ID, 0)
					case flagBool(c, "json"):
						return printJSON(c.App.Writer, struct {
							ID string `json:"id"`
						}{j.ID})
					}
					fmt.Fprintln(c.App.Writer, j.ID)
					return nil
				},
			},
			{
				Name:      "status",
				Usage:     "where a job stands on each target (from their acks: no call is made)",
				ArgsUsage: "ID",
				Before:    oneID("status"),
				Action: func(c *cli.Context) error {
					j, err := client(c).Job(c.Context, c.Args().First())
					if err != nil {
						return err
					}
					warnBehind(c, j.Behind)
					if flagBool(c, "json") {
						return printJSON(c.App.Writer, j)
					}
					fmt.Fprintf(c.App.Writer, "job %s: %s (%s %s, %s; %d bytes of state)\n", j.ID, j.State, j.Plugin, j.Method, countsText(j), j.StateBytes)
					tw := table(c.App.Writer)
					fmt.Fprintln(tw, "NODE\tSTATE\tATTEMPTS\tMS\tERROR\tOUTPUT")
					for _, t := range j.Targets {
						row(tw, t.Name, t.State, t.Attempts, t.MS, oneLine(t.Error), outputText(t))
					}
					return tw.Flush()
				},
			},
			{
				Name:  "list",
				Usage: "list the jobs, oldest first",
				Flags: []cli.Flag{&cli.StringFlag{Name: "tribe", Usage: "only jobs sent to this tribe"}},
				Action: func(c *cli.Context) error {
					if err := noArgs(c); err != nil {
						return err
					}
					js, err := client(c).Jobs(c.Context, c.String("tribe"))
					if err != nil {
						return err
					}
					if flagBool(c, "json") {
						return printJSON(c.App.Writer, js)
					}
					tw := table(c.App.Writer)
					fmt.Fprintln(tw, "JOB\tSTATE\tTRIBES\tCALL\tCREATED\tTARGETS")
					for _, j := range js {
						row(tw, j.ID, j.State, orDash(strings.Join(j.Tribes, ",")),
							j.Plugin+" "+j.Method, j.Created.Local().Format(time.DateTime), countsText(j))
					}
					return tw.Flush()
				},
			},
			{
				Name:      "wait",
				Usage:     "print each target's final state as it arrives; exit 0 only if every target is done",
				ArgsUsage: "ID",
				Flags:     []cli.Flag{waitFlag},
				Before:    oneID("wait"),
				Action: func(c *cli.Context) error {
					return waitJob(c, c.Args().First(), c.Duration("timeout"))
				},
			},
			{
				Name:      "cancel",
				Usage:     "cancel a job: targets that have not started it never run it (trusted writers only)",
				ArgsUsage: "ID",
				Before:    oneID("cancel"),
				Action: func(c *cli.Context) error {
					j, err := client(c).CancelJob(c.Context, c.Args().First())
					if err != nil {
						return err
					}
					if flagBool(c, "json") {
						return printJSON(c.App.Writer, j)
					}
					fmt.Fprintf(c.App.Writer, "cancelled job %s (%s)\n", j.ID, countsText(j))
					return nil
				},
			},
			{
				Name:      "output",
				Usage:     "a target's whole output of a job, fetched from that target and checked against its ack (trusted writers only)",
				ArgsUsage: "ID NODE",
				Before: func(c *cli.Context) error {
					if c.NArg() != 2 {
						return usagef("job output takes a job id and a node")
					}
					return nil
				},
				Action: func(c *cli.Context) error {
					o, err := client(c).JobOutput(c.Context, c.Args().Get(0), c.Args().Get(1))
					if err != nil {
						return err
					}
					if flagBool(c, "json") {
						return printJSON(c.App.Writer, o)
					}
					io.WriteString(c.App.Writer, o.Output)
					if o.Output != "" && !strings.HasSuffix(o.Output, "\n") {
						fmt.Fprintln(c.App.Writer)
					}
					return nil
				},
			},
		},
	}
}

// warnBehind says on stderr why the agent may know less of a job than its
// writer (api.Job.Behind), if it may.
func warnBehind(c *cli.Context, behind string) {
	if behind != "" {
		fmt.Fprintf(c.App.ErrWriter, "tribe: warning: this agent may know less of the job than its writer (%s): a target shown pending may have run it\n", behind)
	}
}

// behindEvery is how often `job wait` asks whether its agent can reach
// the job's writer, while no target ends.
const behindEvery = 5 * time.Second

// waitJob follows job id until no target is pending (or timeout, if not
// zero): one row per target as it ends, then a summary. Targets' acks go
// to the job's writer: an agent that cannot reach it learns of no more
// ends, so while none comes the wait asks for the job's status now and
// then, and says so once on stderr (the same warning as job status).
func waitJob(c *cli.Context, id string, timeout time.Duration) error {
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var warned atomic.Bool
	rows := make(chan struct{}, 1)
	watchCtx, cancelWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	stopWatch := sync.OnceFunc(func() { cancelWatch(); <-watched })
	defer stopWatch()
	go func() {
		defer close(watched)
		tick := time.NewTicker(behindEvery)
		defer tick.Stop()
		for {
			select {
			case <-watchCtx.Done():
				return
			case <-rows:
				tick.Reset(behindEvery)
			case <-tick.C:
				if j, err := client(c).Job(watchCtx, id); err == nil && j.Behind != "" && !warned.Swap(true) {
					warnBehind(c, j.Behind)
				}
			}
		}
	}()
	asJSON := flagBool(c, "json")
	enc := jsonEncoder(c.App.Writer)
	tw := table(c.App.Writer)
	header := false
	ended, ok := 0, 0
	err := client(c).WaitJob(ctx, id, nil, func(t api.JobTarget) {
		select {
		case rows <- struct{}{}:
		default:
		}
		ended++
		if t.State == "done" {
			ok++
		}
		if asJSON {
			enc.Encode(t)
			return
		}
		if !header {
			fmt.Fprintln(tw, "NODE\tSTATE\tATTEMPTS\tMS\tERROR\tOUTPUT")
			header = true
		}
		row(tw, t.Name, t.State, t.Attempts, t.MS, oneLine(t.Error), outputText(t))
		tw.Flush()
	})
	if err != nil {
		return err
	}
	// The stream ends when every target has ended, or when ctx did.
	stopWatch() // so its warning is not written after the summary
	j, err := client(c).Job(c.Context, id)
	if err != nil {
		return err
	}
	if j.State == "pending" && !warned.Load() {
		warnBehind(c, j.Behind)
	}
	if !asJSON {
		fmt.Fprintf(c.App.ErrWriter, "job %s: %s (%s)\n", j.ID, j.State, countsText(j))
	}
	switch {
	case j.State == "pending":
		return fmt.Errorf("job %s: stopped waiting with %d of %s not ended", id, len(j.Targets)-ended, plural(len(j.Targets), "target"))
	case j.State != "done":
		return fmt.Errorf("job %s: %d of %s did not end done", id, len(j.Targets)-j.Counts["done"], plural(len(j.Targets), "target"))
	}
	return nil
}

// countsText is "3 targets: 2 done, 1 pending".
func countsText(j api.Job) string {
	total := 0
	var states []string
	for s, n := range j.Counts {
		total += n
		states = append(states, fmt.Sprintf("%d %s", n, s))
	}
	slices.Sort(states)
	if total == 0 {
		return "no targets yet"
	}
	return plural(total, "target") + ": " + strings.Join(states, ", ")
}

// outputText is the head of a target's output on one line, or "-".
func outputText(t api.JobTarget) string {
	if t.OutputBytes == 0 {
		return "-"
	}
	s := oneLine(t.OutputHead)
	s = names.Cut(s, 80, "...")
	if t.OutputBytes > len(t.OutputHead) {
		s += fmt.Sprintf(" (%d bytes)", t.OutputBytes)
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
