package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node/api"
)

// memberWrites counts the entries written under tribe t's members.
func memberWrites(t *testing.T, n *Node) *atomic.Int64 {
	var count atomic.Int64
	t.Cleanup(n.replica.Watch(tribesPrefix+"t/members/", func(gossip.Change) { count.Add(1) }))
	return &count
}

func statusOf(err error) int {
	var apiErr *api.Error
	if errors.As(err, &apiErr) {
		return apiErr.Status
	}
	return 0
}

// A join or leave naming one node many times (by name and by peer ID)
// writes one entry; more distinct nodes than the bound is refused before
// anything is written; a request whose client has left writes nothing.
func TestJoinAndLeaveWriteEachNodeOnce(t *testing.T) {
	a := startNode(t, loopbackConfig(t, "a"))
	ctx := context.Background()
	if _, err := a.CreateTribe(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	writes := memberWrites(t, a)
	same := append(slices.Repeat([]string{"a"}, 10_000), a.ID().String())

	tooMany := make([]string, maxNodesPerRequest+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("n%d", i)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for _, op := range []struct {
		name string
		do   func(context.Context, string, []string) ([]api.Member, error)
		left int // members once it is done
	}{{"join", a.Join, 1}, {"leave", a.Leave, 0}} {
		t.Run(op.name, func(t *testing.T) {
			before := writes.Load()
			if _, err := op.do(ctx, "t", tooMany); statusOf(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "at most 1024") {
				t.Fatalf("%d nodes: %v; want a bad request naming the bound", len(tooMany), err)
			}
			if _, err := op.do(cancelled, "t", same); !errors.Is(err, context.Canceled) {
				t.Fatalf("with the client gone: %v; want context.Canceled", err)
			}
			if got := writes.Load() - before; got != 0 {
				t.Fatalf("refused requests wrote %d entries", got)
			}
			m, err := op.do(ctx, "t", same)
			if err != nil || len(m) != op.left {
				t.Fatalf("%s one node %d times: %v, %v", op.name, len(same), m, err)
			}
			if got := writes.Load() - before; got != 1 {
				t.Fatalf("%s one node %d times wrote %d entries, want 1", op.name, len(same), got)
			}
		})
	}
}
