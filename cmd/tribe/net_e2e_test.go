package main

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// runToExit runs `tribe args...` that should exit by itself; the bound
// only keeps a regression (an agent that runs on) from hanging the suite.
func runToExit(t *testing.T, args ...string) (stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, tribeBin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("tribe %v did not exit:\n%s", args, out.String())
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), 0
}

func TestAgentOnAPortInUseExits1(t *testing.T) {
	a := newAgent(t, "a")
	a.start()
	tcpListen := "/ip4/127.0.0.1/tcp/" + a.tcpPort()
	out, code := runToExit(t, "agent", "--data-dir", shortTempDir(t), "--name", "b", "--no-mdns",
		"--listen", tcpListen, "--listen", "/ip4/127.0.0.1/udp/0/quic-v1")
	if code != 1 || !strings.Contains(out, "tribe: node: listen on "+tcpListen+": address in use by another process") {
		t.Fatalf("second agent on %s: exit %d, want 1 with a clear message:\n%s", tcpListen, code, out)
	}
}

// tcpPort is the fixed TCP port newAgent chose for a.
func (a *agentProc) tcpPort() string {
	a.t.Helper()
	for i, arg := range a.args {
		if arg == "--listen" && strings.Contains(a.args[i+1], "/tcp/") {
			return a.args[i+1][strings.LastIndex(a.args[i+1], "/")+1:]
		}
	}
	a.t.Fatalf("%s listens on no fixed TCP port", a.name)
	return ""
}

func TestAgentJoinsByHostPort(t *testing.T) {
	a := newAgent(t, "a")
	a.start()
	join := "127.0.0.1:" + a.tcpPort()
	b := newAgent(t, "b", "--join", join)
	b.start()
	waitUntil(t, 60*time.Second, "b to join a by "+join, func() bool { return seesAll(a, b) && seesAll(b, a) })
	aID := a.status().ID
	waitUntil(t, 30*time.Second, "b's status to say it joined", func() bool {
		js := b.status().Joins
		return len(js) == 1 && js[0].State == "joined" && js[0].ID == aID
	})
	out, stderr, code := tribe("status", "--data-dir", b.dir)
	if code != 0 || !strings.Contains(out, "join "+join) || !strings.Contains(out, "joined "+aID) {
		t.Fatalf("tribe status: exit %d\n%s%s", code, out, stderr)
	}
}

func TestStatusSaysTheJoinPeerIsOfAnotherCluster(t *testing.T) {
	a := newAgent(t, "a")
	a.start()
	b := newAgent(t, "b", "--cluster", "staging", "--join", a.tcpJoin())
	b.start()
	waitUntil(t, 60*time.Second, "b's status to say a is of another cluster", func() bool {
		js := b.status().Joins
		return len(js) == 1 && js[0].State == "other_cluster" && js[0].Cluster == "tribe"
	})
	out, _, _ := tribe("status", "--data-dir", b.dir)
	if !strings.Contains(out, `belongs to cluster "tribe", not this one`) {
		t.Fatalf("tribe status does not say the join peer is of another cluster:\n%s", out)
	}
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	if log := b.log.String(); !strings.Contains(log, "level=WARN msg=\"join peer belongs to another cluster") {
		t.Fatalf("no warning in b's log:\n%s", log)
	}
}
