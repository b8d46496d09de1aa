// Package procwait waits for a child process to end without reaping it:
// until it is reaped, its pid, and the number of the process group it
// leads, are still its own, so what it left in its group can be killed
// with no risk of signalling another group that took the number since.
package procwait

import "golang.org/x/sys/unix"

// Exited returns once process pid has ended, without reaping it; an error
// says it could not wait (the caller's Wait will say why).
func Exited(pid int) error {
	var si unix.Siginfo
	for {
		if err := unix.Waitid(unix.P_PID, pid, &si, unix.WEXITED|unix.WNOWAIT, nil); err != unix.EINTR {
			return err
		}
	}
}
