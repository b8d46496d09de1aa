package node

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/policy"
)

func TestReloadDiff(t *testing.T) {
	base := DefaultConfig()
	base.Name, base.DataDir = "web-1", "/var/lib/tribe"
	for _, c := range []struct {
		name             string
		edit             func(*Config)
		changed, restart []string
	}{
		{"nothing", func(*Config) {}, nil, nil},
		{"exec commands", func(c *Config) {
			c.Exec.Commands = map[string]plugins.Command{"uptime": {Argv: []string{"uptime"}}}
		}, []string{"exec"}, nil},
		{"log level and reconnect timeout", func(c *Config) { c.LogLevel, c.ReconnectTimeout = "debug", time.Hour },
			[]string{"log_level", "reconnect_timeout"}, nil},
		{"facts", func(c *Config) { c.FactsFile, c.Facts = "/etc/tribe/facts.yaml", policy.Facts{"tier": "gold"} },
			[]string{"fact", "facts_file"}, nil},
		{"trusted writers change live, listen needs a restart", func(c *Config) {
			c.ListenAddrs = []string{"/ip4/0.0.0.0/tcp/5001"}
			c.Trusted = []string{"12D3KooWPjceQrSwdWXPyLLeABRXmuqt69Rg3sBYbU1Nft9HyQ6X"}
		}, []string{"trusted"}, []string{"listen"}},
		{"a name left unset is the running one", func(c *Config) { c.Name = "" }, nil, nil},
		{"a name set to another one needs a restart", func(c *Config) { c.Name = "web-2" }, nil, []string{"name"}},
		{"no commands is the same as an empty table", func(c *Config) { c.Exec.Commands = map[string]plugins.Command{} }, nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			reread := base
			c.edit(&reread)
			changed, restart := reloadDiff(base, reread)
			if !slices.Equal(changed, c.changed) || !slices.Equal(restart, c.restart) {
				t.Errorf("changed %v, restart %v; want %v, %v", changed, restart, c.changed, c.restart)
			}
		})
	}
}

// execList asks the node's exec plugin, loaded as a tribe would load it,
// for the commands it runs.
func execList(t *testing.T, n *Node) []string {
	t.Helper()
	in, err := n.registry.Load("exec", "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := in.Invoke(context.Background(), "list", nil)
	if err != nil {
		t.Fatal(err)
	}
	var list []plugins.ExecListEntry
	if err := json.Unmarshal(out, &list); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range list {
		names = append(names, e.Name)
	}
	return names
}

// fileReloader does what the agent's Reloader does: defaults, then the
// config file, then the flags (here: c's loopback settings).
func fileReloader(t *testing.T, c Config, file string) Reloader {
	return func() (Config, error) {
		r := loopbackConfig(t, c.Name)
		r.DataDir, r.ListenAddrs = c.DataDir, c.ListenAddrs
		if err := LoadConfigFile(file, &r); err != nil {
			return r, err
		}
		return r, r.Validate()
	}
}

func TestReloadAppliesLiveSettingsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c := loopbackConfig(t, "a")
	reloader := fileReloader(t, c, file)
	write("exec:\n  commands:\n    hello: {argv: [echo, hello]}\nlog_level: warn\n")
	c, err := reloader()
	if err != nil {
		t.Fatal(err)
	}
	level, _ := LogLevelVar(c.LogLevel)
	n := startNodeDeps(t, c, Deps{Reload: reloader, LogLevel: level,
		Facts: func(context.Context) (policy.Facts, error) { return policy.Facts{"hostname": "a"}, nil }})
	if got := execList(t, n); !slices.Equal(got, []string{"hello"}) {
		t.Fatalf("exec commands at start: %v", got)
	}

	factsFile := filepath.Join(dir, "facts.yaml")
	os.WriteFile(factsFile, []byte("tier: gold\n"), 0o600)
	write("exec:\n  commands:\n    uptime: {argv: [uptime]}\nlog_level: debug\nfacts_file: " + factsFile +
		"\nreconnect_timeout: 1h\nlisten: [/ip4/127.0.0.1/tcp/1]\n")
	res, err := n.Reload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"exec", "facts_file", "log_level", "reconnect_timeout"}; !slices.Equal(res.Changed, want) {
		t.Errorf("changed %v, want %v", res.Changed, want)
	}
	if !slices.Equal(res.RestartNeeded, []string{"listen"}) || !res.FactsChanged {
		t.Errorf("restart needed %v (want [listen]), facts changed %v", res.RestartNeeded, res.FactsChanged)
	}
	if got := execList(t, n); !slices.Equal(got, []string{"uptime"}) {
		t.Errorf("exec commands after reload: %v", got)
	}
	if level.Level() != slog.LevelDebug || n.settings().reconnectTimeout != time.Hour {
		t.Errorf("log level %v, reconnect timeout %v", level.Level(), n.settings().reconnectTimeout)
	}
	if f, _ := n.Facts(ctx, ""); f["tier"] != "gold" {
		t.Errorf("the record's facts after reload: tier %v", f["tier"])
	}
	if res, err := n.Reload(ctx); err != nil || len(res.Changed) != 0 || res.FactsChanged {
		t.Errorf("a second reload of the same file: %+v, %v", res, err)
	}

	// A file that does not parse, a bad value and refused facts change
	// nothing, and each is counted.
	for i, bad := range []string{
		"exec: [\n",
		"exec:\n  commands:\n    bad name: {argv: [true]}\n",
		"log_level: loud\n",
		"facts_file: " + filepath.Join(dir, "missing.yaml") + "\n",
		"swarm_key: " + filepath.Join(dir, "missing.key") + "\n", // a restart setting, but the next start would fail
	} {
		write(bad)
		if _, err := n.Reload(ctx); err == nil || !strings.Contains(err.Error(), "nothing changed") {
			t.Errorf("bad file %q: %v", bad, err)
		}
		if got := execList(t, n); !slices.Equal(got, []string{"uptime"}) || level.Level() != slog.LevelDebug {
			t.Errorf("after bad file %q: exec %v, level %v", bad, got, level.Level())
		}
		if got := n.reloads.refused.Load(); got != int64(i+1) {
			t.Errorf("%d refused reloads counted, want %d", got, i+1)
		}
	}
	if f, _ := n.Facts(ctx, ""); f["tier"] != "gold" {
		t.Errorf("the record's facts after refused reloads: tier %v", f["tier"])
	}
}

func TestReloadWithoutReloader(t *testing.T) {
	n := startNode(t, loopbackConfig(t, "a"))
	if _, err := n.Reload(context.Background()); !errors.Is(err, ErrNoReload) {
		t.Errorf("reload with no Reloader: %v", err)
	}
}

// Trusted writers change live: a node that is no longer one loses what it
// wrote as one and may not write more; trusted again, it has it back.
func TestReloadChangesTrustedWriters(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "agent.yaml")
	c := loopbackConfig(t, "a")
	reloader := fileReloader(t, c, file)
	os.WriteFile(file, nil, 0o600)
	n := startNodeDeps(t, c, Deps{Reload: reloader})
	if _, err := n.CreateTribe(ctx, "core"); err != nil {
		t.Fatal(err)
	}
	other := "12D3KooWPjceQrSwdWXPyLLeABRXmuqt69Rg3sBYbU1Nft9HyQ6X"
	os.WriteFile(file, []byte("trusted: ["+other+"]\n"), 0o600)
	res, err := n.Reload(ctx)
	if err != nil || !slices.Equal(res.Changed, []string{"trusted"}) {
		t.Fatalf("reload to another trusted writer: %+v, %v", res, err)
	}
	if st, _ := n.Status(ctx); st.Trust != "list" || !slices.Equal(st.Trusted, []string{other}) || st.Admission != "pending" {
		t.Errorf("status after reload: trust %s %v, this node %s", st.Trust, st.Trusted, st.Admission)
	}
	if _, err := n.Tribe(ctx, "core"); err == nil {
		t.Error("the tribe this node created as a trusted writer still counts")
	}
	if _, err := n.CreateTribe(ctx, "web"); err == nil || !strings.Contains(err.Error(), "trusted writer") {
		t.Errorf("create by a node no longer trusted: %v", err)
	}
	// A reload does not open trust (a trusted line commented out would
	// let every peer that can connect write the state): a restart does.
	os.WriteFile(file, nil, 0o600)
	if _, err := n.Reload(ctx); err == nil || !strings.Contains(err.Error(), "restart the agent") {
		t.Fatalf("reload to open trust: %v, want it refused", err)
	}
	if st, _ := n.Status(ctx); st.Trust != "list" {
		t.Fatalf("trust %s after a refused reload", st.Trust)
	}
	os.WriteFile(file, []byte("trusted: ["+n.ID().String()+"]\n"), 0o600)
	if res, err := n.Reload(ctx); err != nil || !slices.Equal(res.Changed, []string{"trusted"}) {
		t.Fatalf("reload back to this node as the trusted writer: %+v, %v", res, err)
	}
	if _, err := n.Tribe(ctx, "core"); err != nil {
		e, ok := n.replica.Get("tribes/core")
		t.Errorf("the stored tribe did not come back: %v (%v %v)", err, e, ok)
	}
}

// applyLive copies every live setting: once applied, a reload of the same
// config finds no live change (only the restart ones stay different).
func TestApplyLiveCopiesEveryLiveSetting(t *testing.T) {
	inForce, reread := DefaultConfig(), DefaultConfig()
	reread.Exec.Commands = map[string]plugins.Command{"uptime": {Argv: []string{"uptime"}}}
	reread.Facts, reread.FactsFile = policy.Facts{"tier": "gold"}, "/etc/tribe/facts.yaml"
	reread.LogLevel, reread.ReconnectTimeout = "debug", time.Hour
	reread.Trusted = []string{"12D3KooWPjceQrSwdWXPyLLeABRXmuqt69Rg3sBYbU1Nft9HyQ6X"}
	reread.TargetPeers = 3
	if changed, _ := reloadDiff(inForce, reread); len(changed) != len(liveSettings) {
		t.Fatalf("the test changes %v, not every live setting", changed)
	}
	applyLive(&inForce, reread)
	if changed, restart := reloadDiff(inForce, reread); len(changed) != 0 || !slices.Equal(restart, []string{"target_peers"}) {
		t.Errorf("after applyLive: changed %v, restart %v", changed, restart)
	}
}
