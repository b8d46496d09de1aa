package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/keys"
	"github.com/tribeagent/tribe/node/api"
)

// Three agents found by --join alone: b and c join a, and find each other
// through a (DHT rendezvous). Then c is killed and comes back without
// --join, from the peers it remembered.
func TestThreeAgentsJoinThenRestartFromRememberedPeers(t *testing.T) {
	a := newAgent(t, "a")
	a.start()
	b := newAgent(t, "b", "--join", a.tcpJoin())
	b.start()
	c := newAgent(t, "c", "--join", a.tcpJoin())
	c.start()
	all := []*agentProc{a, b, c}
	waitUntil(t, 60*time.Second, "every agent to see the other two", func() bool {
		return seesAll(a, b, c) && seesAll(b, a, c) && seesAll(c, a, b)
	})
	for _, x := range all {
		if st := x.status(); st.Peers != 2 || st.Name != x.name || len(st.Addrs) == 0 {
			t.Fatalf("%s status: %+v", x.name, st)
		}
	}

	// A killed agent's QUIC connections linger on its peers until QUIC's
	// idle timeout; the restarted c's own view starts empty, so what it sees
	// below it found again by itself.
	c.kill()
	c.args = withoutFlag(c.args, "--join")
	c.start()
	waitUntil(t, 60*time.Second, "restarted c to see a and b again without --join", func() bool {
		return seesAll(c, a, b) && seesAll(a, b, c) && seesAll(b, a, c)
	})

	// A clean stop removes the socket and exits 0.
	if err := b.stop(); err != nil {
		t.Fatalf("b did not exit cleanly: %v\n%s", err, b.log)
	}
	if _, err := os.Stat(filepath.Join(b.dir, api.SocketName)); !os.IsNotExist(err) {
		t.Fatalf("b left its socket behind: %v", err)
	}
}

// A seed that is down when an agent starts does not stop it: the agent
// keeps dialling and joins once the seed is up.
func TestDeadSeedIsRetried(t *testing.T) {
	a := newAgent(t, "a")
	a.start()
	seed := a.tcpJoin()
	a.kill()
	b := newAgent(t, "b", "--join", seed)
	b.start()
	if st := b.status(); st.Peers != 0 {
		t.Fatalf("b has peers with its seed down: %+v", st)
	}
	a.start() // same data dir and port: same address
	waitUntil(t, 60*time.Second, "b to reach its seed once it is up", func() bool { return seesAll(b, a) })
}

func withoutFlag(args []string, flag string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == flag {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

func TestCLIErrors(t *testing.T) {
	empty := shortTempDir(t)
	cases := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"no agent", []string{"status", "--data-dir", empty}, 1, "no agent running at " + filepath.Join(empty, api.SocketName)},
		{"no agent via env", []string{"peers"}, 1, "no agent running"},
		{"unknown command", []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"unknown flag", []string{"status", "--frob"}, 2, "flag provided but not defined"},
		{"extra argument", []string{"peers", "x"}, 2, "takes no arguments"},
		{"quic join without peer id", []string{"agent", "--data-dir", empty, "--no-mdns", "--join", "/ip4/127.0.0.1/udp/1/quic-v1"}, 2, "no /p2p/"},
		{"join without port", []string{"agent", "--data-dir", empty, "--no-mdns", "--join", "host.example"}, 2, "HOST:PORT"},
		{"bad listen", []string{"agent", "--data-dir", empty, "--listen", "nonsense"}, 2, "listen address"},
		{"quic with swarm key", []string{"agent", "--data-dir", empty, "--swarm-key", "k", "--listen", "/ip4/127.0.0.1/udp/0/quic-v1"}, 2, "QUIC cannot use a swarm key"},
		{"bad log level", []string{"agent", "--data-dir", empty, "--log-level", "loud"}, 2, "--log-level"},
		{"bad log format", []string{"agent", "--data-dir", empty, "--log-format", "xml"}, 2, `--log-format: log format "xml": use text or json`},
		{"bad fact", []string{"agent", "--data-dir", empty, "--fact", "Bad-Key=1"}, 2, "--fact"},
		{"policy without tribe", []string{"policy", "create", "p", "true"}, 2, "tribe"},
		{"missing config", []string{"agent", "--data-dir", empty, "--config", filepath.Join(empty, "nope.yaml")}, 1, "config file"},
		{"sim bad scenario", []string{"sim", "--scenario", "nope"}, 2, "--scenario"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TRIBE_DATA_DIR", empty)
			stdout, stderr, code := tribe(tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, stdout, stderr)
			}
			if !strings.HasPrefix(stderr, "tribe: ") || !strings.Contains(stderr, tc.msg) || strings.Count(stderr, "\n") != 1 {
				t.Fatalf("stderr %q: want one line `tribe: ...%s...`", stderr, tc.msg)
			}
		})
	}
}

func TestAgentRefusesBadFilesInItsDataDir(t *testing.T) {
	dir := shortTempDir(t)
	key := filepath.Join(dir, keys.IdentityFile)
	os.WriteFile(key, []byte("garbage"), 0o600)
	_, stderr, code := tribe("agent", "--data-dir", dir, "--no-mdns", "--listen", "/ip4/127.0.0.1/tcp/0")
	if code != 1 || !strings.Contains(stderr, key) || !strings.Contains(stderr, "move it aside") {
		t.Fatalf("corrupt key: exit %d, %q", code, stderr)
	}
	os.Remove(key)
	os.WriteFile(key, nil, 0o644)
	os.Chmod(key, 0o644)
	_, stderr, code = tribe("agent", "--data-dir", dir, "--no-mdns", "--listen", "/ip4/127.0.0.1/tcp/0")
	if code != 1 || !strings.Contains(stderr, "chmod 600 "+key) {
		t.Fatalf("open key: exit %d, %q", code, stderr)
	}
	os.Remove(key)

	// A damaged state store stops the agent; it is never reset.
	store := filepath.Join(dir, "state.db")
	os.WriteFile(store, []byte(strings.Repeat("x", 8192)), 0o600)
	_, stderr, code = tribe("agent", "--data-dir", dir, "--no-mdns", "--listen", "/ip4/127.0.0.1/tcp/0")
	if code != 1 || !strings.Contains(stderr, store) || !strings.Contains(stderr, "move it aside") {
		t.Fatalf("damaged store: exit %d, %q", code, stderr)
	}
	if b, _ := os.ReadFile(store); len(b) != 8192 {
		t.Fatal("the damaged store was modified")
	}
}

func TestSecondAgentOnOneDataDirIsRefused(t *testing.T) {
	a := newAgent(t, "a")
	a.start()
	_, stderr, code := tribe("agent", "--data-dir", a.dir, "--no-mdns", "--listen", "/ip4/127.0.0.1/tcp/0")
	if code != 1 || !strings.Contains(stderr, "in use by another agent") {
		t.Fatalf("exit %d, %q", code, stderr)
	}
}

func TestStatusAndPeersTables(t *testing.T) {
	a := newAgent(t, "alpha")
	a.start()
	b := newAgent(t, "beta", "--join", a.tcpJoin())
	b.start()
	waitUntil(t, 30*time.Second, "a to see b", func() bool { return seesAll(a, b) })
	out, _, code := tribe("status", "--data-dir", a.dir)
	if code != 0 || !strings.Contains(out, "alpha") || !strings.Contains(out, "peers            1") {
		t.Fatalf("status table (exit %d):\n%s", code, out)
	}
	// Global flags work before the command too.
	out, _, code = tribe("--data-dir", a.dir, "peers")
	if code != 0 || !strings.Contains(out, "beta") || !strings.Contains(out, b.status().ID) {
		t.Fatalf("peers table (exit %d):\n%s", code, out)
	}
	// nodes --detailed carries the facts, in JSON and in the table.
	var nodes []api.Node
	a.cliJSON(&nodes, "nodes", "--detailed", "--status", "alive")
	if len(nodes) != 2 || nodes[0].Facts["hostname"] == nil || len(nodes[0].Addrs) == 0 {
		t.Fatalf("nodes --detailed: %+v", nodes)
	}
	var plain []api.Node
	a.cliJSON(&plain, "nodes")
	if len(plain) != 2 || plain[0].Facts != nil {
		t.Fatalf("nodes without --detailed carries facts: %+v", plain)
	}
	out, _, code = tribe("nodes", "--detailed", "--data-dir", a.dir)
	if code != 0 || !strings.Contains(out, "ADDRESS") || !strings.Contains(out, "hostname=") {
		t.Fatalf("nodes --detailed table (exit %d):\n%s", code, out)
	}
}

func TestAgentLogsJSON(t *testing.T) {
	a := newAgent(t, "alpha", "--log-format", "json")
	a.start()
	a.stop()
	lines := strings.Split(strings.TrimSpace(a.log.String()), "\n")
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil || rec["msg"] == nil || rec["level"] == nil {
			t.Fatalf("not a JSON log line: %q (%v)", l, err)
		}
	}
	if len(lines) < 2 {
		t.Fatalf("too few log lines: %q", lines)
	}
}
