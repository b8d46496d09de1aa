package sim

import (
	"context"
	"errors"
	"testing"
	"time"
)

// WaitProgress waits as long as progress rises, and gives up once it
// stalls: slow but steady is not a failure, stuck is.
func TestWaitProgress(t *testing.T) {
	s := &Sim{}
	ctx := context.Background()
	start := time.Now()
	steady := func() int { return int(time.Since(start) / (100 * time.Millisecond)) }
	// Done after 600 ms of steady progress, with a 300 ms stall limit: a
	// fixed 300 ms deadline would have failed it.
	if _, err := s.WaitProgress(ctx, 300*time.Millisecond, steady, func() bool { return time.Since(start) > 600*time.Millisecond }); err != nil {
		t.Fatalf("steady progress: %v", err)
	}
	stuck := func() int { return 3 }
	took, err := s.WaitProgress(ctx, 200*time.Millisecond, stuck, func() bool { return false })
	if !errors.Is(err, ErrStalled) || took < 200*time.Millisecond {
		t.Fatalf("stuck progress: %v after %v, want ErrStalled after 200ms", err, took)
	}
}
