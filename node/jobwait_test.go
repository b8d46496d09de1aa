package node

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins/jobs"
)

// WaitJob streams each target's final state as its ack arrives, once,
// skips acks that are not final, and ends at the expiry with the targets
// that never acked as expired.
func TestWaitJobStreamsAcksAndEndsAtExpiry(t *testing.T) {
	w := startNode(t, loopbackConfig(t, "w"))
	keys, ids := identities(t, 3)
	id := writeJobTo(t, w, ids, 3*time.Second)
	rows := make(chan api.JobTarget, 10)
	waited := make(chan error, 1)
	go func() {
		waited <- w.WaitJob(context.Background(), id, func(r *api.JobTarget) {
			if r != nil {
				rows <- *r
			}
		})
	}()
	take := func(i int, a jobs.Ack) {
		t.Helper()
		p, _ := peer.IDFromPrivateKey(keys[i])
		if _, err := w.replica.Accept(p, signAck(t, keys[i], id, a)); err != nil {
			t.Fatal(err)
		}
	}
	next := func(want string, state jobs.State) {
		t.Helper()
		select {
		case r := <-rows:
			if r.ID != want || r.State != string(state) {
				t.Fatalf("row %+v; want %s %s", r, want, state)
			}
		case err := <-waited:
			t.Fatalf("the wait ended before %s %s: %v", want, state, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("no row for %s %s", want, state)
		}
	}
	now := w.now()
	take(0, jobs.Ack{State: jobs.Done, Attempts: 1, OK: true, Started: now, Ended: now})
	next(ids[0], jobs.Done)
	take(1, jobs.Ack{State: jobs.Running, Attempts: 1, Started: now})
	take(0, jobs.Ack{State: jobs.Done, Attempts: 1, OK: true, Started: now, Ended: now}) // again: no second row
	take(1, jobs.Ack{State: jobs.Failed, Attempts: 1, Started: now, Ended: now, Error: "boom"})
	next(ids[1], jobs.Failed)
	// The third never acks: expired once the job is, and the wait ends
	// (a node not known here, named by its hash).
	next("", jobs.Expired)
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not end after the expiry")
	}
	if len(rows) != 0 {
		t.Fatalf("rows after the last: %+v", <-rows)
	}
	if j, err := w.Job(context.Background(), id); err != nil || j.State != "failed" || j.Counts["done"] != 1 {
		t.Fatalf("the job after: %+v %v", j, err)
	}
}

// A target that died mid-run leaves its running ack: past the expiry and
// the longest its attempt could last, the job counts it interrupted, the
// job ends failed, and `job wait` ends with it (it waited forever).
func TestWaitEndsPastExpiryWithARunningAck(t *testing.T) {
	var offset atomic.Int64 // the writer's clock runs ahead of the real one by this
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	w := startNodeDeps(t, loopbackConfig(t, "w"), Deps{Now: clock})
	keys, ids := identities(t, 1)
	id := writeJobTo(t, w, ids, time.Hour)
	p, _ := peer.IDFromPrivateKey(keys[0])
	if _, err := w.replica.Accept(p, signAck(t, keys[0], id, jobs.Ack{State: jobs.Running, Attempts: 1, Started: w.now()})); err != nil {
		t.Fatal(err)
	}
	if j := jobState(t, w, id); j.State != "pending" || j.Counts["running"] != 1 {
		t.Fatalf("before the expiry: %+v", j)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound on failure only
	defer cancel()
	waited := make(chan error, 1)
	go func() { waited <- w.WaitJob(ctx, id, func(*api.JobTarget) {}) }()
	offset.Store(int64(time.Hour + jobs.MaxTimeout + jobs.AckGrace))
	if err := <-waited; err != nil || ctx.Err() != nil {
		t.Fatalf("the wait: %v, still waiting: %v", err, ctx.Err())
	}
	if j := jobState(t, w, id); j.State != "failed" || j.Counts["interrupted"] != 1 {
		t.Fatalf("past the expiry and the timeout: %+v", j)
	}
}
