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
	err := app.Run(args)
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "tribe: %s\n", strings.TrimPrefix(err.Error(), "api: "))
	if errors.As(err, new(usageError)) {
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
	cmds := []*cli.Command{agentCommand(), statusCommand(), peersCommand(), simCommand()}
	for _, c := range cmds {
		c.Flags = append(c.Flags, commonFlags()...)
		c.OnUsageError = onUsage
	}
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
		HideHelpCommand:           true,
		ExitErrHandler:            func(*cli.Context, error) {}, // run() maps errors to exit codes
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("unknown command %q; see `tribe --help`", c.Args().First())
			}
			return cli.ShowAppHelp(c)
		},
	}
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
