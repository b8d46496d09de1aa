package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
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

// An agent runs its Go code on one core unless --procs (or the config
// file's procs) says otherwise, 0 meaning every core; GOMAXPROCS in the
// environment still decides. Read from the Go runtime's own gauge in each
// real agent process's metrics.
func TestProcs(t *testing.T) {
	file := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(file, []byte("procs: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOMAXPROCS=") })
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want float64
	}{
		{"default", nil, nil, 1},
		{"flag", nil, []string{"--procs", "2"}, 2},
		{"file", nil, []string{"--config", file}, 3},
		{"flag over file", nil, []string{"--config", file, "--procs", "2"}, 2},
		// Go's default, as this test process got it (the CPUs it may
		// use, and a cgroup's CPU limit), unless its environment set one.
		{"every core", nil, []string{"--procs", "0"}, float64(runtime.GOMAXPROCS(0))},
		{"environment", []string{"GOMAXPROCS=4"}, []string{"--procs", "2"}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "every core" && os.Getenv("GOMAXPROCS") != "" {
				t.Skip("GOMAXPROCS is set for this test process: Go's default is not known here")
			}
			a := newAgent(t, "p", append([]string{"--metrics-addr", "127.0.0.1:0"}, tc.args...)...)
			cmd := exec.Command(tribeBin, a.args...)
			cmd.Env = append(slices.Clone(env), tc.env...)
			a.startCmd(cmd)
			got, ok := series(scrapeMetrics(t, a.status().MetricsAddr), "go_sched_gomaxprocs_threads")
			if !ok || got != tc.want {
				t.Fatalf("GOMAXPROCS %v (found: %v), want %v", got, ok, tc.want)
			}
		})
	}
	_, stderr, code := tribe("agent", "--data-dir", shortTempDir(t), "--no-mdns", "--procs", "-1")
	if code != 2 || !strings.Contains(stderr, "procs -1: a number of cores, or 0 for every core") {
		t.Fatalf("--procs -1: exit %d, %q; want exit 2 saying what is wanted", code, stderr)
	}
}
