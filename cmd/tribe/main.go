// Command tribe is the tribe agent and its CLI: `tribe agent` runs the agent
// on this host; every other command talks to the local agent's control API
// over <data-dir>/tribe.sock and prints a table, or JSON with --json.
//
// Errors go to stderr as "tribe: <message>" with exit status 1, usage errors
// with exit status 2.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/node"
	"github.com/tribeagent/tribe/node/api"
)

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// usageError is a mistake in how a command was called: exit status 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// run runs the CLI and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	// The completion flag must stay last for urfave/cli to see it.
	complete := len(args) > 1 && args[len(args)-1] == completeFlag
	if complete {
		args = args[:len(args)-1]
	}
	args, err := helpArgs(app, args)
	if err == nil {
		args = interspersed(app, args)
		if complete {
			args = append(args, completeFlag)
		}
		err = app.Run(args)
	}
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "tribe: %s\n", shownLines(strings.TrimPrefix(err.Error(), "api: ")))
	// urfave/cli reports a missing required flag with an unexported type.
	if errors.As(err, new(usageError)) || strings.HasPrefix(err.Error(), "Required flag") {
		return 2
	}
	return 1
}

func defaultDataDir() string {
	home, err := os.UserHomeDir()
	if err != nil {
		return ".tribe"
	}
	return filepath.Join(home, ".tribe")
}

// commonFlags are accepted before and after the command name.
func commonFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{
			Name:    "data-dir",
			Usage:   "the agent's data dir: identity, remembered peers, state and the API socket tribe.sock",
			EnvVars: []string{"TRIBE_DATA_DIR"},
			Value:   defaultDataDir(),
		},
		&cli.BoolFlag{Name: "json", Usage: "print JSON instead of tables"},
	}
}

func newApp(stdout, stderr io.Writer) *cli.App {
	onUsage := func(c *cli.Context, err error, _ bool) error { return usageError{err} }
	cmds := []*cli.Command{agentCommand(), statusCommand(), peersCommand(), nodesCommand()}
	cmds = append(cmds, tribeCommands()...)
	cmds = append(cmds, admitCommand(), revokeCommand(), idCommand())
	cmds = append(cmds, forceLeaveCommand(), reloadCommand())
	cmds = append(cmds, factsCommand(), policyCommand(), pluginCommand(), callCommand(), taskCommand(), jobCommand(), simCommand())
	cmds = append(cmds, watchCommand())
	cmds = append(cmds, versionCommand(), completionCommand())
	var prepare func(cs []*cli.Command)
	prepare = func(cs []*cli.Command) {
		for _, c := range cs {
			c.Flags = append(c.Flags, commonFlags()...)
			c.OnUsageError = onUsage
			if len(c.Subcommands) > 0 && c.Action == nil {
				c.Action = groupAction
			}
			prepare(c.Subcommands)
		}
	}
	prepare(cmds)
	return &cli.App{
		Name:                      "tribe",
		Usage:                     "a masterless fleet agent: peers that find each other, group themselves into tribes by policy, and call plugins on each other",
		Version:                   node.Version,
		Writer:                    stdout,
		ErrWriter:                 stderr,
		Flags:                     commonFlags(),
		Commands:                  cmds,
		OnUsageError:              onUsage,
		DisableSliceFlagSeparator: true,
		EnableBashCompletion:      true,
		ExitErrHandler:            func(*cli.Context, error) {}, // run() maps errors to exit codes
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return unknownCommand(c.Args().First(), c.App.Name)
			}
			return cli.ShowAppHelp(c)
		},
	}
}

// interspersed lets flags follow a command's arguments (`tribe show core
// --json`), as users expect: urfave/cli stops parsing flags at the first
// argument, so the command's flags are moved in front of its arguments.
// "--" still ends flag parsing.
func interspersed(app *cli.App, args []string) []string {
	takesValue := func(flags []cli.Flag, name string) (known, value bool) {
		for _, f := range flags {
			for _, n := range f.Names() {
				if n == name {
					_, isBool := f.(*cli.BoolFlag)
					return true, !isBool
				}
			}
		}
		return false, false
	}
	// Find the command after the global flags.
	i := 1
	for i < len(args) && strings.HasPrefix(args[i], "-") && args[i] != "--" {
		name, _, hasValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if _, value := takesValue(app.Flags, name); value && !hasValue {
			i++
		}
		i++
	}
	if i >= len(args) {
		return args
	}
	cmd := app.Command(args[i])
	if cmd == nil {
		return args
	}
	for len(cmd.Subcommands) > 0 && i+1 < len(args) {
		sub := cmd.Command(args[i+1])
		if sub == nil {
			break
		}
		cmd, i = sub, i+1
	}
	var flags, positional []string
	rest := args[i+1:]
	for j := 0; j < len(rest); j++ {
		a := rest[j]
		if a == "--" {
			positional = append(positional, rest[j:]...)
			break
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		known, value := takesValue(cmd.Flags, name)
		if !strings.HasPrefix(a, "-") || a == "-" || !known {
			if strings.HasPrefix(a, "-") && a != "-" {
				flags = append(flags, a) // unknown: let the parser say so
				continue
			}
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		if value && !hasValue && j+1 < len(rest) {
			j++
			flags = append(flags, rest[j])
		}
	}
	out := append([]string{}, args[:i+1]...)
	out = append(out, flags...)
	return append(out, positional...)
}

// flagString returns the value of a common flag given after or before the
// command name, the later one winning.
func flagString(c *cli.Context, name string) string {
	for _, ctx := range c.Lineage() {
		if ctx.IsSet(name) {
			return ctx.String(name)
		}
	}
	return c.String(name)
}

func flagBool(c *cli.Context, name string) bool {
	for _, ctx := range c.Lineage() {
		if ctx.IsSet(name) {
			return ctx.Bool(name)
		}
	}
	return false
}

// client returns an API client for the agent of the chosen data dir.
func client(c *cli.Context) *api.Client {
	return api.NewClient(filepath.Join(flagString(c, "data-dir"), api.SocketName))
}

// noArgs refuses positional arguments for commands that take none.
func noArgs(c *cli.Context) error {
	if c.Args().Present() {
		return usagef("%s takes no arguments, got %q", c.Command.Name, c.Args().Slice())
	}
	return nil
}

// shownLines is s with each of its lines as names.Shown shows it: an
// error may carry another node's text (a job target's error, a plugin's
// answer), and a multi-line one (a CEL error's caret) keeps its lines.
func shownLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = names.Shown(l)
	}
	return strings.Join(lines, "\n")
}
