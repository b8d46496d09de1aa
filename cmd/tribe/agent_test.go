package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/tribeagent/tribe/node"
)

// The config file sets conns_per_ip and the flag replaces it, as for every
// setting.
func TestConnsPerIPFromFileAndFlag(t *testing.T) {
	file := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(file, []byte("conns_per_ip: 100\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	configOf := func(args ...string) node.Config {
		t.Helper()
		cmd := agentCommand()
		var got node.Config
		cmd.Action = func(c *cli.Context) error {
			var err error
			got, err = agentConfig(c)
			return err
		}
		app := &cli.App{Flags: []cli.Flag{&cli.StringFlag{Name: "data-dir"}}, Commands: []*cli.Command{cmd}}
		if err := app.Run(append([]string{"tribe", "--data-dir", t.TempDir(), "agent"}, args...)); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := configOf("--config", file).ConnsPerIP; got != 100 {
		t.Errorf("from the file: %d, want 100", got)
	}
	if got := configOf("--config", file, "--conns-per-ip", "2000").ConnsPerIP; got != 2000 {
		t.Errorf("the flag over the file: %d, want 2000", got)
	}
	if got := configOf().ConnsPerIP; got != 0 {
		t.Errorf("neither: %d, want 0 (2 x ConnHigh)", got)
	}
}
