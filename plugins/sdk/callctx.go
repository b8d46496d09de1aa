package sdk

import (
	"context"
	"sync"
	"time"
)

// callCtx is one call's context: it ends at the call's deadline or when
// the agent cancels the call. Its timer is armed only when the method
// first asks for Done (or a context derived from it does): most methods
// never do, and setting and stopping a timer per call wakes Go's
// scheduler, 0–8% of a call's round trip in three alternated runs
// against context.WithTimeout. Err reads the clock instead.
type callCtx struct {
	deadline time.Time

	mu    sync.Mutex
	done  chan struct{} // made on the first Done
	timer *time.Timer   // armed with done
	err   error
}

func (c *callCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *callCtx) Value(any) any { return nil }

func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	c.done = make(chan struct{})
	if c.err == nil && c.past() {
		c.err = context.DeadlineExceeded
	}
	if c.err != nil {
		close(c.done)
	} else {
		c.timer = time.AfterFunc(time.Until(c.deadline), func() { c.end(context.DeadlineExceeded) })
	}
	return c.done
}

func (c *callCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil && c.past() {
		c.finishLocked(context.DeadlineExceeded)
	}
	return c.err
}

// past reports whether the deadline has passed.
func (c *callCtx) past() bool { return !time.Now().Before(c.deadline) }

// end ends the context with err (context.Canceled when the agent cancels
// the call or the call returns), unless it has ended already, or its
// deadline has passed: then it ends as context.WithTimeout's would, with
// context.DeadlineExceeded (the agent's cancel comes at its own deadline,
// at or just after the plugin's).
func (c *callCtx) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	if c.past() {
		err = context.DeadlineExceeded
	}
	c.finishLocked(err)
}

// finishLocked ends the context with err, closing done if a method asked
// for it (its timer is armed then).
func (c *callCtx) finishLocked(err error) {
	c.err = err
	if c.done != nil {
		close(c.done)
		c.timer.Stop()
	}
}

func (c *callCtx) cancel() { c.end(context.Canceled) }
