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
	"github.com/tribeagent/tribe/gossip/authority"
	"github.com/tribeagent/tribe/node/api"
)

// writesUnder counts the entries written under prefix.
func writesUnder(t *testing.T, n *Node, prefix string) *atomic.Int64 {
	var count atomic.Int64
	t.Cleanup(n.replica.Watch(prefix, func(gossip.Change) { count.Add(1) }))
	return &count
}

// manyNames is more distinct node names than one request may carry.
func manyNames() []string {
	out := make([]string, maxNodesPerRequest+1)
	for i := range out {
		out[i] = fmt.Sprintf("n%d", i)
	}
	return out
}

type nodesOp[T any] struct {
	name string
	do   func(context.Context, []string) ([]T, error)
	want int // results once it is done
}

// checkEachNodeOnce runs each op with too many nodes, with its client gone,
// and with one node named 10,000 times by name and once by peer ID: the
// first two write nothing, the last writes one entry under writes.
func checkEachNodeOnce[T any](t *testing.T, writes *atomic.Int64, name string, id string, ops ...nodesOp[T]) {
	same := append(slices.Repeat([]string{name}, 10_000), id)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			before := writes.Load()
			if _, err := op.do(context.Background(), manyNames()); statusOf(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "at most 1024") {
				t.Fatalf("%d nodes: %v; want a bad request naming the bound", maxNodesPerRequest+1, err)
			}
			if _, err := op.do(cancelled, same); !errors.Is(err, context.Canceled) {
				t.Fatalf("with the client gone: %v; want context.Canceled", err)
			}
			if got := writes.Load() - before; got != 0 {
				t.Fatalf("refused requests wrote %d entries", got)
			}
			res, err := op.do(context.Background(), same)
			if err != nil || len(res) != op.want {
				t.Fatalf("one node %d times: %v, %v", len(same), res, err)
			}
			if got := writes.Load() - before; got != 1 {
				t.Fatalf("one node %d times wrote %d entries, want 1", len(same), got)
			}
		})
	}
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
	in := func(f func(context.Context, string, []string) ([]api.Member, error)) func(context.Context, []string) ([]api.Member, error) {
		return func(ctx context.Context, nodes []string) ([]api.Member, error) { return f(ctx, "t", nodes) }
	}
	checkEachNodeOnce(t, writesUnder(t, a, tribesPrefix+"t/members/"), "a", a.ID().String(),
		nodesOp[api.Member]{"join", in(a.Join), 1}, nodesOp[api.Member]{"leave", in(a.Leave), 0})
}

// The same for admit and revoke.
func TestAdmitAndRevokeWriteEachNodeOnce(t *testing.T) {
	admin, ns := trustedCluster(t, nil, "b")
	admit := func(ctx context.Context, nodes []string) ([]api.Admission, error) {
		return admin.Admit(ctx, api.AdmitRequest{Nodes: nodes})
	}
	checkEachNodeOnce(t, writesUnder(t, admin, authority.AdmittedPrefix), "b", ns["b"].ID().String(),
		nodesOp[api.Admission]{"admit", admit, 1}, nodesOp[api.Admission]{"revoke", admin.Revoke, 1})
}

// TestDeleteTribeRemovesWhatTrustedWritersOwn: a deleted tribe is gone
// from every view, its plugins with it; deleting it again, or a tribe
// that never was, is an error; joining it afterwards needs `create`; and a
// tribe a policy names is refused, naming the policy.
func TestDeleteTribeRemovesWhatTrustedWritersOwn(t *testing.T) {
	ctx := context.Background()
	n := startNode(t, loopbackConfig(t, "a"))
	if _, err := n.CreateTribe(ctx, "core"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Join(ctx, "core", []string{"a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.LoadPlugin(ctx, "echo", "core", api.LoadRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.DeleteTribe(ctx, "core"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Tribe(ctx, "core"); statusOf(err) != http.StatusNotFound {
		t.Fatalf("show after delete: %v; want not found", err)
	}
	if list, _ := n.Tribes(ctx); len(list) != 0 {
		t.Fatalf("list after delete: %+v", list)
	}
	if left := n.replica.Prefix(tribesPrefix + "core/"); len(left) != 0 {
		t.Fatalf("entries left under the tribe: %d", len(left))
	}
	if _, err := n.DeleteTribe(ctx, "core"); statusOf(err) != http.StatusNotFound {
		t.Fatalf("second delete: %v; want not found", err)
	}
	if _, err := n.DeleteTribe(ctx, "never"); statusOf(err) != http.StatusNotFound {
		t.Fatalf("delete of a tribe that never was: %v; want not found", err)
	}
	if _, err := n.Join(ctx, "core", []string{"a"}); statusOf(err) != http.StatusNotFound || !strings.Contains(err.Error(), "tribe create core") {
		t.Fatalf("join after delete: %v; want not found, asking for create", err)
	}

	// Plugins alone do not make a tribe one can join.
	if _, err := n.CreateTribe(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.LoadPlugin(ctx, "echo", "web", api.LoadRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.replica.Delete(ctx, tribesPrefix+"web"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Join(ctx, "web", []string{"a"}); statusOf(err) != http.StatusNotFound {
		t.Fatalf("join to a tribe only a plugin keeps: %v; want not found", err)
	}

	if _, err := n.CreatePolicy(ctx, "storage", "store", "true"); err != nil {
		t.Fatal(err)
	}
	_, err := n.DeleteTribe(ctx, "store")
	if statusOf(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "policy storage names it; delete the policy first") {
		t.Fatalf("delete of a tribe a policy names: %v", err)
	}
	if _, err := n.Join(ctx, "store", []string{"a"}); err != nil {
		t.Fatalf("join to a tribe a policy names: %v", err)
	}
}
