// Package sdnotify tells systemd how a service started with Type=notify is
// doing: READY=1 once it serves, STOPPING=1 when it begins to shut down.
// It is the sd_notify(3) protocol without libsystemd: one datagram, sent to
// the Unix socket named by $NOTIFY_SOCKET.
//
// Take the socket once with FromEnv at start, then Notify on it. Outside
// systemd (no $NOTIFY_SOCKET) the Socket is empty and Notify does nothing,
// so callers notify unconditionally. Safe for concurrent use.
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

// Socket is where systemd listens for this service's notifications. The
// zero value is no socket: Notify sends nothing.
type Socket struct {
	path string
}

// FromEnv returns the socket named by $NOTIFY_SOCKET and removes the
// variable from the environment, as sd_notify's unset_environment does, so
// that the processes this one starts (the exec plugin's commands) do not
// inherit it and speak for the service.
func FromEnv() Socket {
	s := Socket{path: os.Getenv(Env)}
	os.Unsetenv(Env)
	return s
}

// At returns the socket at path: a file path, or an abstract socket when
// it starts with "@" (as systemd writes it). An empty path is no socket.
func At(path string) Socket { return Socket{path: path} }

// Notify sends state to the socket. It reports false, nil when there is no
// socket: the process was not started by systemd as a notify service.
func (s Socket) Notify(state string) (bool, error) {
	path := s.path
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
