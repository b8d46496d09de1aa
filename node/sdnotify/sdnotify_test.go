package sdnotify

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// listen opens a datagram socket standing in for systemd's.
func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func receive(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

func TestNotifyPathSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "sdn-") // short: socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "notify")
	conn := listen(t, path)
	t.Setenv(Env, path)
	sock := FromEnv()
	if v, ok := os.LookupEnv(Env); ok {
		t.Errorf("FromEnv left %s=%q for child processes", Env, v)
	}
	for _, state := range []string{Ready, Stopping} {
		sent, err := sock.Notify(state)
		if err != nil || !sent {
			t.Fatalf("Notify(%q) = %v, %v; want true, nil", state, sent, err)
		}
		if got := receive(t, conn); got != state {
			t.Errorf("systemd got %q, want %q", got, state)
		}
	}
}

func TestNotifyAbstractSocket(t *testing.T) {
	name := "@tribe-sdnotify-test-" + filepath.Base(t.TempDir())
	conn := listen(t, name)
	sent, err := At(name).Notify(Ready)
	if err != nil || !sent {
		t.Fatalf("At(%q).Notify = %v, %v; want true, nil", name, sent, err)
	}
	if got := receive(t, conn); got != Ready {
		t.Errorf("systemd got %q, want %q", got, Ready)
	}
}

func TestNotifyWithoutSystemd(t *testing.T) {
	t.Setenv(Env, "")
	if sent, err := FromEnv().Notify(Ready); sent || err != nil {
		t.Errorf("Notify without %s = %v, %v; want false, nil", Env, sent, err)
	}
	if sent, err := (Socket{}).Notify(Ready); sent || err != nil {
		t.Errorf("the zero Socket's Notify = %v, %v; want false, nil", sent, err)
	}
}

func TestNotifyErrors(t *testing.T) {
	for _, tc := range []struct{ path, state string }{
		{"vsock:2:1234", Ready},                        // not for an agent
		{"relative/socket", Ready},                     // neither a path nor abstract
		{"/nonexistent/tribe-sdnotify/notify", Ready},  // nobody listens
		{"@tribe-sdnotify-test-nobody-listens", Ready}, // nobody listens
		{"/tmp/x", ""},                                 // nothing to say
	} {
		if sent, err := At(tc.path).Notify(tc.state); sent || err == nil {
			t.Errorf("At(%q).Notify(%q) = %v, %v; want false and an error", tc.path, tc.state, sent, err)
		}
	}
}
