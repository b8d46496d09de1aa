package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api"
)

// TestAgentNotifiesSystemd runs the agent as systemd runs a Type=notify
// service: READY=1 must come only once the API answers, and STOPPING=1 when
// SIGTERM begins the shutdown.
func TestAgentNotifiesSystemd(t *testing.T) {
	a := newAgent(t, "notify")
	sock := filepath.Join(shortTempDir(t), "notify")
	systemd, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer systemd.Close()

	cmd := exec.Command(tribeBin, a.args...)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	// A file, not a buffer: it is read while the agent still writes.
	logFile, err := os.Create(filepath.Join(t.TempDir(), "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	agentLog := func() string {
		b, _ := os.ReadFile(logFile.Name())
		return string(b)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-done
	}()

	next := func(want string) {
		t.Helper()
		systemd.SetReadDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 256)
		n, err := systemd.Read(buf)
		if err != nil {
			t.Fatalf("waiting for %s: %v\n%s", want, err, agentLog())
		}
		if got := string(buf[:n]); got != want {
			t.Fatalf("systemd was told %q, want %q", got, want)
		}
	}
	next("READY=1")
	if _, err := api.NewClient(filepath.Join(a.dir, api.SocketName)).Status(context.Background()); err != nil {
		t.Fatalf("READY=1 came before the API answered: %v", err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	next("STOPPING=1")
	select {
	case err := <-done:
		done <- err // for the deferred Wait
		if err != nil {
			t.Fatalf("agent exited with %v\n%s", err, agentLog())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("agent did not stop on SIGTERM\n%s", agentLog())
	}
}
