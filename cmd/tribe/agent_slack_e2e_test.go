package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// A real agent runs every thread at the agent's timer slack (package
// timerslack), Go's system monitor included, when it may set other
// threads' (CAP_SYS_NICE: as root).
func TestAgentThreadsTakeTheTimerSlack(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("setting another thread's timer slack needs CAP_SYS_NICE: run as root")
	}
	a := newAgent(t, "slack")
	a.start()
	pid := a.cmd.Process.Pid
	tids, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		t.Fatal(err)
	}
	if len(tids) < 2 {
		t.Fatalf("%d threads", len(tids))
	}
	for _, d := range tids {
		b, err := os.ReadFile("/proc/" + d.Name() + "/timerslack_ns")
		if err != nil {
			continue // the thread ended
		}
		if ns, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); ns != timerSlack.Nanoseconds() {
			t.Fatalf("thread %s of the agent: slack %d ns, want %d", d.Name(), ns, timerSlack.Nanoseconds())
		}
	}
}
