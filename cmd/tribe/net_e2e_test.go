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
	var tcpListen string
	for i, arg := range a.args {
		if arg == "--listen" && strings.Contains(a.args[i+1], "/tcp/") {
			tcpListen = a.args[i+1]
		}
	}
	out, code := runToExit(t, "agent", "--data-dir", shortTempDir(t), "--name", "b", "--no-mdns",
		"--listen", tcpListen, "--listen", "/ip4/127.0.0.1/udp/0/quic-v1")
	if code != 1 || !strings.Contains(out, "tribe: node: listen on "+tcpListen+": address in use by another process") {
		t.Fatalf("second agent on %s: exit %d, want 1 with a clear message:\n%s", tcpListen, code, out)
	}
}
