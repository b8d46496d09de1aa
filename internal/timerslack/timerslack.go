// Package timerslack sets the Linux timer slack of every thread of the
// process: how much later than asked the kernel may end a timed sleep, to
// wake a thread once for several timers.
//
// Go's system monitor (sysmon, one thread of every Go process) sleeps 20 µs
// at a time while any goroutine runs or waits in a system call, and an
// agent's work is many short bursts (probes, gossip, acks), each of which
// wakes it from its deep sleep. With the kernel's default slack of 50 µs that
// is a wake-up every 70 µs or so of each burst: in an idle agent of 20 on
// loopback (2026-11-29, the builds before and after the agent set 1 ms
// alternated, two pairs, CPU from /proc/PID/task/*/schedstat), sysmon took
// 31–33 of the agent's 124–137 ms of CPU a minute, and 12–15 of 103–117. Sysmon's other duties (taking the processor back
// from a goroutine stuck in a system call, preempting one that ran 10 ms)
// keep their purpose at a millisecond's grain.
//
// A thread may set its own slack; setting another's needs CAP_SYS_NICE
// (root has it). A thread takes its creator's slack, so a process started
// with a slack (systemd's TimerSlackNSec=, which the packaged unit sets)
// has it everywhere and needs nothing of this package.
package timerslack

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Set makes ns the timer slack of every thread of this process that has
// less, and returns how many it changed. Threads that come meanwhile take
// their creator's, so it goes over the threads until a pass changes none.
// The first error (EPERM for another thread without CAP_SYS_NICE) is
// returned with what could be set.
func Set(ns int64) (changed int, err error) {
	val := strconv.FormatInt(ns, 10)
	var first error
	for pass := 0; pass < 3; pass++ {
		tids, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return changed, fmt.Errorf("timerslack: %w", err)
		}
		now := 0
		for _, t := range tids {
			path := "/proc/" + t.Name() + "/timerslack_ns" // a thread's own is at /proc/TID, not under task/
			b, err := os.ReadFile(path)
			if errors.Is(err, os.ErrNotExist) {
				continue // the thread ended
			}
			if err == nil {
				var cur int64
				if cur, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && cur >= ns {
					continue
				}
			}
			if err == nil {
				err = os.WriteFile(path, []byte(val), 0)
			}
			if err != nil {
				if first == nil {
					first = fmt.Errorf("timerslack: thread %s: %w", t.Name(), err)
				}
				continue
			}
			now++
		}
		changed += now
		if now == 0 {
			break
		}
	}
	return changed, first
}
