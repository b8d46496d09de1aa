package main

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tribeagent/tribe/node"
)

func TestInterspersedMovesCommandFlagsFirst(t *testing.T) {
	app := newApp(io.Discard, io.Discard)
	cases := []struct{ in, want []string }{
		{[]string{"tribe", "show", "core", "--json"}, []string{"tribe", "show", "--json", "core"}},
		{[]string{"tribe", "--data-dir", "/d", "join", "core", "n1", "--data-dir", "/e", "n2"},
			[]string{"tribe", "--data-dir", "/d", "join", "--data-dir", "/e", "core", "n1", "n2"}},
		{[]string{"tribe", "join", "core", "--", "--json"}, []string{"tribe", "join", "core", "--", "--json"}},
		{[]string{"tribe", "agent", "--listen", "/ip4/1.2.3.4/tcp/1", "--no-mdns"}, []string{"tribe", "agent", "--listen", "/ip4/1.2.3.4/tcp/1", "--no-mdns"}},
		{[]string{"tribe", "peers", "x", "--bogus"}, []string{"tribe", "peers", "--bogus", "x"}},
		{[]string{"tribe", "frob", "--json"}, []string{"tribe", "frob", "--json"}},
		{[]string{"tribe"}, []string{"tribe"}},
	}
	for _, tc := range cases {
		if got := interspersed(app, tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("interspersed(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// runCLI runs the CLI in-process and returns stdout, stderr and the status.
func runCLI(args ...string) (string, string, int) {
	var stdout, stderr strings.Builder
	code := run(append([]string{"tribe"}, args...), &stdout, &stderr)
	return stdout.String(), stderr.String(), code
}

func TestUnknownCommandAtEveryLevel(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"frob"}, `tribe: unknown command "frob" for "tribe"; see tribe --help`},
		{[]string{"plugin", "lsit"}, `tribe: unknown command "lsit" for "tribe plugin"; see tribe plugin --help`},
		{[]string{"plugin", "lsit", "--json"}, `tribe: unknown command "lsit" for "tribe plugin"; see tribe plugin --help`},
		{[]string{"policy", "crate", "x"}, `tribe: unknown command "crate" for "tribe policy"; see tribe policy --help`},
		{[]string{"help", "frob"}, `tribe: unknown command "frob" for "tribe"; see tribe --help`},
		{[]string{"help", "plugin", "lsit"}, `tribe: unknown command "lsit" for "tribe plugin"; see tribe plugin --help`},
		{[]string{"plugin", "help", "lsit"}, `tribe: unknown command "lsit" for "tribe plugin"; see tribe plugin --help`},
	}
	for _, tc := range cases {
		stdout, stderr, code := runCLI(tc.args...)
		if code != 2 || strings.TrimSpace(stderr) != tc.want || stdout != "" {
			t.Errorf("tribe %q: exit %d, stderr %q, stdout %q; want exit 2 and %q", tc.args, code, stderr, stdout, tc.want)
		}
	}
}

func TestHelpAtEveryLevel(t *testing.T) {
	cases := []struct {
		args []string
		want string // the NAME line of the page
	}{
		{[]string{"help"}, "tribe - a masterless"},
		{[]string{"help", "policy"}, "tribe policy - manage policies"},
		{[]string{"help", "policy", "create"}, "tribe policy create - create or replace"},
		{[]string{"policy", "help", "create"}, "tribe policy create - create or replace"},
		{[]string{"policy", "help"}, "tribe policy - manage policies"},
		{[]string{"policy", "create", "--help"}, "tribe policy create - create or replace"},
		{[]string{"--data-dir", "/nowhere", "help", "call"}, "tribe call - "},
		{[]string{"help", "version"}, "tribe version - "},
	}
	for _, tc := range cases {
		stdout, stderr, code := runCLI(tc.args...)
		if code != 0 || !strings.Contains(stdout, "NAME:\n   "+tc.want) {
			t.Errorf("tribe %q: exit %d, stderr %q, stdout:\n%s\nwant the page of %q", tc.args, code, stderr, stdout, tc.want)
		}
	}
}

func TestVersion(t *testing.T) {
	stdout, _, code := runCLI("version")
	if code != 0 || !strings.HasPrefix(stdout, "tribe "+node.Version+" (") {
		t.Errorf("tribe version: exit %d, %q", code, stdout)
	}
	stdout, _, code = runCLI("version", "--json")
	var v versionInfo
	if err := json.Unmarshal([]byte(stdout), &v); code != 0 || err != nil || v.Version != node.Version || v.Go == "" {
		t.Errorf("tribe version --json: exit %d, %v, %q", code, err, stdout)
	}
}

func TestCompletionScripts(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish"} {
		stdout, stderr, code := runCLI("completion", shell)
		if code != 0 || !strings.Contains(stdout, "tribe") {
			t.Errorf("tribe completion %s: exit %d, %s", shell, code, stderr)
			continue
		}
		if _, err := exec.LookPath(shell); err != nil {
			t.Logf("%s not installed: script not parsed", shell)
			continue
		}
		f := filepath.Join(t.TempDir(), "script")
		if err := os.WriteFile(f, []byte(stdout), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(shell, "-n", f).CombinedOutput(); err != nil {
			t.Errorf("%s -n on tribe completion %s: %v\n%s", shell, shell, err, out)
		}
	}
	if _, stderr, code := runCLI("completion", "tcsh"); code != 2 || !strings.Contains(stderr, `unknown shell "tcsh"`) {
		t.Errorf("tribe completion tcsh: exit %d, %q", code, stderr)
	}
}

// The scripts ask the binary for the words that may follow; that must see
// subcommands, also after the interspersed-flags rewrite. urfave/cli reads
// os.Args for this, so it runs the binary.
func TestCompletionWords(t *testing.T) {
	stdout, _, code := tribe("policy", completeFlag)
	if code != 0 || !strings.Contains(stdout, "create\n") || !strings.Contains(stdout, "test\n") {
		t.Errorf("tribe policy %s: exit %d, %q", completeFlag, code, stdout)
	}
	stdout, _, _ = tribe("policy", "create", "-", completeFlag)
	if !strings.Contains(stdout, "--tribe") {
		t.Errorf("tribe policy create - %s: %q", completeFlag, stdout)
	}
}
