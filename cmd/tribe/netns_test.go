package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// testnet is a private network of Linux network namespaces: one holding a
// bridge, and one per host with a veth into the bridge and an address in
// 10.77.<net>.0/24. Nothing is attached to a real interface, so multicast
// (mDNS) stays inside it. Close removes everything it made.
type testnet struct {
	t     *testing.T
	tag   string
	hosts []string // namespace names
	made  []string // namespaces to delete
}

// newTestnet builds n hosts or skips the test when it cannot (not root, no
// `ip`, no namespaces).
func newTestnet(t *testing.T, n int) *testnet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping multi-host test: building network namespaces needs root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping multi-host test: the `ip` command (iproute2) is not installed")
	}
	tn := &testnet{t: t, tag: fmt.Sprintf("%d", os.Getpid()%100000)}
	t.Cleanup(tn.close)
	br := "tribe-br-" + tn.tag
	if out, err := exec.Command("ip", "netns", "add", br).CombinedOutput(); err != nil {
		t.Skipf("skipping multi-host test: cannot create a network namespace: %v: %s", err, out)
	}
	tn.made = append(tn.made, br)
	tn.ip("-n", br, "link", "add", "br0", "type", "bridge")
	tn.ip("-n", br, "link", "set", "br0", "up")
	for i := range n {
		ns := fmt.Sprintf("tribe-h%d-%s", i, tn.tag)
		tn.ip("netns", "add", ns)
		tn.made = append(tn.made, ns)
		outer, inner := fmt.Sprintf("tv%d-%s", i, tn.tag), fmt.Sprintf("tp%d-%s", i, tn.tag)
		tn.ip("link", "add", outer, "netns", br, "type", "veth", "peer", "name", inner, "netns", ns)
		tn.ip("-n", br, "link", "set", outer, "master", "br0", "up")
		tn.ip("-n", ns, "link", "set", "lo", "up")
		tn.ip("-n", ns, "link", "set", inner, "name", "eth0")
		tn.ip("-n", ns, "addr", "add", tn.addr(i)+"/24", "dev", "eth0")
		tn.ip("-n", ns, "link", "set", "eth0", "up")
		tn.ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", "eth0")
		tn.hosts = append(tn.hosts, ns)
	}
	return tn
}

func (tn *testnet) addr(i int) string { return fmt.Sprintf("10.77.0.%d", i+1) }

func (tn *testnet) ip(args ...string) {
	tn.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		tn.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// command runs the tribe binary inside host i's namespace.
func (tn *testnet) command(i int, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", tn.hosts[i], tribeBin}, args...)...)
}

func (tn *testnet) close() {
	for _, ns := range tn.made {
		exec.Command("ip", "netns", "del", ns).Run() // removes its veths too
	}
}

// Three agents on three hosts, no --join: they find each other by mDNS.
func TestMDNSDiscoveryAcrossHosts(t *testing.T) {
	tn := newTestnet(t, 3)
	var agents []*agentProc
	for i := range tn.hosts {
		a := &agentProc{t: t, name: fmt.Sprintf("h%d", i), dir: shortTempDir(t)}
		a.args = []string{"agent", "--data-dir", a.dir, "--name", a.name, "--listen", "/ip4/" + tn.addr(i) + "/tcp/4001", "--log-level", "debug"}
		// The process runs inside the namespace; its Unix socket is a
		// file, so the CLI reaches it from here.
		defer a.kill()
		a.startCmd(tn.command(i, a.args...))
		agents = append(agents, a)
	}
	waitUntil(t, 60*time.Second, "every agent to find the other two by mDNS", func() bool {
		return seesAll(agents[0], agents[1], agents[2]) &&
			seesAll(agents[1], agents[0], agents[2]) &&
			seesAll(agents[2], agents[0], agents[1])
	})
	// Nothing else could have introduced them (no --join, fresh data dirs),
	// but check that mDNS says so too.
	found := 0
	for _, a := range agents {
		found += strings.Count(a.log.String(), "found peer by mdns")
	}
	if found == 0 {
		t.Errorf("no agent logged an mDNS discovery:\n%s", agents[0].log)
	}
}
