package main

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// helpArgs turns `help` in a command position into --help on the command it
// names, so `tribe help policy create`, `tribe policy help create` and
// `tribe policy create --help` print the same page, and a command that does
// not exist gets the same usage error at every level.
func helpArgs(app *cli.App, args []string) ([]string, error) {
	i := 1
	for i < len(args) && strings.HasPrefix(args[i], "-") && args[i] != "--" {
		name, _, hasValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if name == "data-dir" && !hasValue {
			i++
		}
		i++
	}
	cmds, path := app.Commands, app.Name
	for ; i < len(args); i++ {
		if args[i] == "help" || args[i] == "h" {
			break
		}
		next := findCommand(cmds, args[i])
		if next == nil || len(next.Subcommands) == 0 {
			return args, nil // not a help request: the command runs as given
		}
		cmds, path = next.Subcommands, path+" "+next.Name
	}
	if i >= len(args) {
		return args, nil
	}
	topics := args[i+1:]
	for _, t := range topics {
		next := findCommand(cmds, t)
		if next == nil || strings.HasPrefix(t, "-") {
			return nil, unknownCommand(t, path)
		}
		cmds, path = next.Subcommands, path+" "+next.Name
	}
	out := append([]string{}, args[:i]...)
	out = append(out, topics...)
	return append(out, "--help"), nil
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// groupAction runs for a command that has subcommands when none was named:
// without arguments it prints the command's help, otherwise the first
// argument is a subcommand that does not exist.
func groupAction(c *cli.Context) error {
	if c.Args().Present() {
		return unknownCommand(c.Args().First(), c.Command.HelpName)
	}
	return cli.ShowSubcommandHelp(c)
}

func unknownCommand(name, parent string) error {
	return usagef("unknown command %q for %q; see %s --help", name, parent, parent)
}
