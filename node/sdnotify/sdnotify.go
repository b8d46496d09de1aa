// Package sdnotify tells systemd how a service started with Type=notify is
// doing: READY=1 once it serves, STOPPING=1 when it begins to shut down.
// It is the sd_notify(3) protocol without libsystemd: one datagram, sent to
// the Unix socket named by $NOTIFY_SOCKET.
//
// Outside systemd (no $NOTIFY_SOCKET) every call does nothing, so callers
// notify unconditionally. Safe for concurrent use.
package sdnotify

import (
	"errors"
	"fmt"
	"net"
	"os"
)

// The states this agent sends; see sd_notify(3) for the rest.
const (
	Ready    = "READY=1"
	Stopping = "STOPPING=1"
)

// Env is the variable systemd sets to the socket it listens on.
const Env = "NOTIFY_SOCKET"

// Notify sends state to the socket named by $NOTIFY_SOCKET. It reports
// false, nil when the variable is unset: the process was not started by
// systemd as a notify service.
func Notify(state string) (bool, error) {
	return NotifySocket(os.Getenv(Env), state)
}

// NotifySocket sends state to the datagram socket at path: a file path, or
// an abstract socket when it starts with "@" (as systemd writes it). An
// empty path sends nothing and reports false, nil.
func NotifySocket(path, state string) (bool, error) {
	if path == "" {
		return false, nil
	}
	if path[0] != '/' && path[0] != '@' {
		// vsock addresses (vsock:CID:PORT) are for virtual machines
		// notifying their host; an agent runs inside the host.
		return false, fmt.Errorf("sdnotify: unsupported %s %q", Env, path)
	}
	if state == "" {
		return false, errors.New("sdnotify: empty state")
	}
	// Go's net package maps a leading "@" to the abstract namespace.
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return false, fmt.Errorf("sdnotify: %w", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return false, fmt.Errorf("sdnotify: %w", err)
	}
	return true, nil
}
