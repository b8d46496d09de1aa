package timerslack

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Set reaches every thread it may; threads made later take it from their
// creator; without CAP_SYS_NICE it still sets the calling thread's and says
// why it could not set the others'.
func TestSetEveryThread(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("no /proc here:", err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	self := syscall.Gettid()
	before, err := slackOf(self)
	if err != nil {
		t.Fatal(err)
	}
	want := before + 700_000
	changed, err := Set(want)
	if got, _ := slackOf(self); got != want {
		t.Fatalf("the calling thread's slack %d after Set(%d) (changed %d, %v)", got, want, changed, err)
	}
	if err != nil {
		if os.Geteuid() == 0 || !errors.Is(err, os.ErrPermission) {
			t.Fatalf("Set: %v", err)
		}
		t.Skipf("other threads need CAP_SYS_NICE: %v", err)
	}
	tids, _ := os.ReadDir("/proc/self/task")
	for _, d := range tids {
		tid, _ := strconv.Atoi(d.Name())
		if got, err := slackOf(tid); err == nil && got < want { // an error: the thread ended
			t.Fatalf("thread %s: slack %d, want at least %d", d.Name(), got, want)
		}
	}
	// Each goroutine below locks its thread and ends, which ends the
	// thread: the next runs on a thread made from one of those, and has
	// the slack too.
	got := make(chan int64)
	for range 4 {
		go func() {
			runtime.LockOSThread() // this goroutine's thread ends with it: the next needs a new one
			s, _ := slackOf(syscall.Gettid())
			got <- s
		}()
		if s := <-got; s != want {
			t.Fatalf("a new thread's slack %d, want %d", s, want)
		}
	}
	if changed, err := Set(want); changed != 0 || err != nil {
		t.Fatalf("Set again: changed %d, %v", changed, err)
	}
}

// slackOf is thread tid's timer slack, in ns.
func slackOf(tid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/timerslack_ns")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}
