package sdk

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// A call's context ends at its deadline whether or not Done was asked
// for first, ends at once when cancelled, keeps the first reason, and
// carries the end to contexts derived from it.
func TestCallCtx(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Err alone: no timer, the clock says.
		c := newCallCtx(time.Second)
		if d, ok := c.Deadline(); !ok || !d.Equal(time.Now().Add(time.Second)) {
			t.Errorf("deadline %v %v", d, ok)
		}
		if c.Err() != nil {
			t.Fatal("ended before its deadline")
		}
		time.Sleep(time.Second)
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Errorf("after the deadline: %v", c.Err())
		}
		select {
		case <-c.Done(): // asked for after the end: already closed
		default:
			t.Error("Done asked for after the deadline is open")
		}

		// Done first: the timer closes it at the deadline, not before.
		c = newCallCtx(time.Second)
		done := c.Done()
		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("done before the deadline")
		default:
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("open at the deadline")
		}
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Errorf("err %v", c.Err())
		}

		// Cancelled: a derived context ends too; a later deadline changes
		// nothing.
		c = newCallCtx(time.Second)
		child, stop := context.WithCancel(c)
		defer stop()
		c.cancel()
		<-child.Done()
		<-c.Done()
		time.Sleep(2 * time.Second)
		if !errors.Is(c.Err(), context.Canceled) || !errors.Is(child.Err(), context.Canceled) {
			t.Errorf("cancelled: %v, child %v", c.Err(), child.Err())
		}

		// Cancelled after its deadline, nobody having asked: it ended at
		// the deadline, as context.WithTimeout's would say.
		c = newCallCtx(time.Second)
		time.Sleep(time.Second)
		c.cancel()
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Errorf("cancelled after the deadline: %v", c.Err())
		}

		// Cancelled before anyone asked for Done: closed when asked.
		c = newCallCtx(time.Second)
		c.cancel()
		<-c.Done()
		if c.Value("any") != nil {
			t.Error("a value in an empty context")
		}
	})
}

func newCallCtx(timeout time.Duration) *callCtx {
	return &callCtx{deadline: time.Now().Add(timeout)}
}
