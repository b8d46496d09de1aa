package sim

import (
	"context"
	"slices"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node"
)

func memberNames(t *testing.T, s *Sim, i int, tribe string) []string {
	t.Helper()
	tr, err := s.Node(i).Tribe(context.Background(), tribe)
	if err != nil {
		return nil
	}
	var names []string
	for _, m := range tr.Members {
		names = append(names, m.Name)
	}
	slices.Sort(names)
	return names
}

func everyNodeSees(t *testing.T, s *Sim, tribe string, want []string) func() bool {
	return func() bool {
		for i := range s.Len() {
			if s.Node(i) != nil && !slices.Equal(memberNames(t, s, i, tribe), want) {
				return false
			}
		}
		return true
	}
}

// A tribe created on one node and joined by others reaches all 50 nodes.
func TestFiftyNodesConvergeOnATribe(t *testing.T) {
	ctx := context.Background()
	s := start(t, Config{Nodes: 50, Seed: 3})
	if _, err := s.WaitFor(ctx, time.Minute, func() bool { return s.Components() == 1 && allKnowNodes(s, 50) }); err != nil {
		t.Fatalf("cluster did not form: %v", err)
	}
	if _, err := s.Node(7).CreateTribe(ctx, "core"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WaitFor(ctx, 30*time.Second, func() bool {
		_, err := s.Node(42).Tribe(ctx, "core")
		return err == nil
	}); err != nil {
		t.Fatal("node 42 never saw tribe core")
	}
	if _, err := s.Node(42).Join(ctx, "core", []string{"n1", "n2", "n3"}); err != nil {
		t.Fatal(err)
	}
	took, err := s.WaitFor(ctx, time.Minute, everyNodeSees(t, s, "core", []string{"n1", "n2", "n3"}))
	if err != nil {
		t.Fatalf("not every node agrees on core: %v", err)
	}
	t.Logf("membership reached all 50 nodes in %v", took)
	if _, err := s.WaitFor(ctx, time.Minute, s.Converged); err != nil {
		t.Fatal("state hashes differ")
	}
	noSyncPenalties(t, s)
}

// withCore waits until every node knows all n nodes, creates tribe core on
// node 0 and waits until every node holds the same state.
func withCore(t *testing.T, s *Sim, n int) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.WaitFor(ctx, time.Minute, func() bool { return allKnowNodes(s, n) }); err != nil {
		t.Fatalf("not every node knows all %d nodes: %v", n, err)
	}
	if _, err := s.Node(0).CreateTribe(ctx, "core"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WaitFor(ctx, time.Minute, s.Converged); err != nil {
		t.Fatalf("no convergence on tribe core: %v", err)
	}
}

// noSyncPenalties checks that no node penalised another: honest peers
// never break the sync protocol, however their pulls cross partitions,
// crashes and writes.
func noSyncPenalties(t *testing.T, s *Sim) {
	t.Helper()
	for i := range s.Len() {
		if nd := s.Node(i); nd != nil {
			rej := nd.Replica().Rejected()
			if rej["sync_penalised"] != 0 || rej["sync_unwanted"] != 0 {
				t.Errorf("node %d penalised an honest peer: %v", i, rej)
			}
		}
	}
}

func allKnowNodes(s *Sim, n int) bool {
	for i := range s.Len() {
		if nd := s.Node(i); nd != nil {
			nodes, _ := nd.Nodes(context.Background(), "")
			if len(nodes) != n {
				return false
			}
		}
	}
	return true
}

// Writes on both sides of a partition converge to one state after healing.
func TestPartitionWithWritesOnBothSidesConverges(t *testing.T) {
	ctx := context.Background()
	const n = 20
	s := start(t, Config{Nodes: n, Seed: 4})
	if _, err := s.WaitFor(ctx, time.Minute, func() bool { return s.Components() == 1 && allKnowNodes(s, n) }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Node(0).CreateTribe(ctx, "core"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WaitFor(ctx, time.Minute, s.Converged); err != nil {
		t.Fatal(err)
	}
	a, b := rangeOf(0, n/2), rangeOf(n/2, n)
	if err := s.Partition(a, b); err != nil {
		t.Fatal(err)
	}
	// Both sides write, including the same key (n5's manual membership).
	if _, err := s.Node(1).Join(ctx, "core", []string{"n1", "n5"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Node(1).CreateTribe(ctx, "left"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Node(15).Join(ctx, "core", []string{"n15", "n5"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Node(15).CreateTribe(ctx, "right"); err != nil {
		t.Fatal(err)
	}
	if s.Converged() {
		t.Fatal("the sides agree during the partition: the test would prove nothing")
	}
	if err := s.Heal(); err != nil {
		t.Fatal(err)
	}
	took, err := s.WaitFor(ctx, 2*time.Minute, s.Converged)
	if err != nil {
		t.Fatalf("no convergence after healing: %v", err)
	}
	t.Logf("converged %v after healing", took)
	want := []string{"n1", "n15", "n5"}
	if got := memberNames(t, s, 3, "core"); !slices.Equal(got, want) {
		t.Fatalf("core = %v, want %v", got, want)
	}
	tribes, _ := s.Node(12).Tribes(ctx)
	if len(tribes) != 3 {
		t.Fatalf("tribes after healing: %+v", tribes)
	}
	noSyncPenalties(t, s)
}

// A node that was down while the fleet changed catches up from its data
// dir plus anti-entropy.
func TestRestartedNodeCatchesUp(t *testing.T) {
	ctx := context.Background()
	const n = 10
	s := start(t, Config{Nodes: n, Seed: 5})
	withCore(t, s, n)
	const victim = 6
	// What a node took from peers is in its store within BehindFor; a
	// crash before loses it (and anti-entropy brings it back).
	time.Sleep(2 * gossip.BehindFor)
	if err := s.Crash(victim); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b", "c"} {
		if _, err := s.Node(2).CreateTribe(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Node(3).Join(ctx, "core", []string{"n1", "n6"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(ctx, victim); err != nil {
		t.Fatal(err)
	}
	// Before any sync, the restarted node has what it stored.
	if _, err := s.Node(victim).Tribe(ctx, "core"); err != nil {
		t.Fatalf("restarted node lost its stored state: %v", err)
	}
	if _, err := s.WaitFor(ctx, time.Minute, s.Converged); err != nil {
		t.Fatal("restarted node did not catch up")
	}
	if got := memberNames(t, s, victim, "core"); !slices.Equal(got, []string{"n1", "n6"}) {
		t.Fatalf("core on the restarted node: %v", got)
	}
	noSyncPenalties(t, s)
}

// A rogue peer publishes forged, unauthorised, unknown-kind and
// future-dated entries: every node rejects and counts them, and no state
// changes.
func TestBadEntriesAreRejectedCountedAndChangeNothing(t *testing.T) {
	ctx := context.Background()
	const n = 8
	s := start(t, Config{Nodes: n, Seed: 6, Trusted: []int{0}})
	withCore(t, s, n)
	before := s.Node(0).Replica().Hash()

	// The rogue: a host of its own on the mock network, with pubsub.
	rogueKey, _, _ := crypto.GenerateEd25519Key(nil)
	rogue, err := s.Mocknet().AddPeer(rogueKey, ma.StringCast("/ip6/100::ffff:ffff/tcp/4001"))
	if err != nil {
		t.Fatal(err)
	}
	ps, err := pubsub.NewGossipSub(ctx, rogue, gossip.PubSubOptions("")...)
	if err != nil {
		t.Fatal(err)
	}
	topic, err := ps.Join("tribe/tribe/state/1")
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := s.Mocknet().LinkPeers(rogue.ID(), s.ID(i)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Mocknet().ConnectPeers(rogue.ID(), s.ID(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.WaitFor(ctx, 30*time.Second, func() bool { return len(topic.ListPeers()) == n }); err != nil {
		t.Fatalf("rogue meshed with %d nodes", len(topic.ListPeers()))
	}

	rogueID := rogue.ID()
	sign := func(e gossip.Entry) []byte {
		signed, err := gossip.Sign(e, rogueKey)
		if err != nil {
			t.Fatal(err)
		}
		return signed.Raw
	}
	now := gossip.MakeHLC(time.Now().UnixMilli(), 0)
	// Forged: an entry the rogue may write (its own record), with a
	// signature that does not verify. What an entry says is checked
	// before its signature, so a forged entry it may not write is
	// refused as unauthorized.
	good := sign(gossip.Entry{Key: "nodes/" + rogueID.String(), Value: []byte(`{"name":"rogue"}`), HLC: now})
	forged := append([]byte(nil), good...)
	forged[len(forged)-5] ^= 0xff
	bad := map[string][]byte{
		"unauthorized":  sign(gossip.Entry{Key: "tribes/evil", HLC: now}),
		"bad_signature": forged,
		"unknown_key":   sign(gossip.Entry{Key: "secrets/x", HLC: now}),
		"from_future":   sign(gossip.Entry{Key: "nodes/" + rogueID.String(), HLC: gossip.MakeHLC(time.Now().Add(time.Hour).UnixMilli(), 0)}),
		"malformed":     []byte("not an envelope"),
	}
	for _, raw := range bad {
		if err := topic.Publish(ctx, raw); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.WaitFor(ctx, 30*time.Second, func() bool {
		for i := range n {
			rej := s.Node(i).Replica().Rejected()
			for reason := range bad {
				if rej[reason] == 0 {
					return false
				}
			}
		}
		return true
	}); err != nil {
		t.Fatalf("not every node counted every kind of bad entry: node 3 has %v", s.Node(3).Replica().Rejected())
	}
	for i := range n {
		if h := s.Node(i).Replica().Hash(); h != before {
			t.Fatalf("node %d's state changed", i)
		}
	}
	// A trusted node's write still goes through.
	if _, err := s.Node(0).CreateTribe(ctx, "after"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WaitFor(ctx, 30*time.Second, func() bool {
		_, err := s.Node(n-1).Tribe(ctx, "after")
		return err == nil
	}); err != nil {
		t.Fatal("trusted write after the attack did not spread")
	}
	// An untrusted node is refused locally.
	if _, err := s.Node(3).CreateTribe(ctx, "mine"); err == nil {
		t.Fatal("untrusted node created a tribe")
	}
}

// Each node writes its own record at start, before it has a connection.
// With periodic sync off, those records still reach every node of a
// sparse cluster (each node linked only to the one it joined): the record
// goes out by pubsub once the first peer joins the topic. Pulled on join
// alone, it would stop at that peer.
func TestRecordsWrittenBeforeAnyPeerReachEveryNode(t *testing.T) {
	ctx := context.Background()
	const n = 20
	s := start(t, Config{Nodes: n, Seed: 5, Joins: 1, Sparse: true,
		Tune: func(_ int, c *node.Config) { c.SyncInterval = time.Hour }})
	took, err := s.WaitFor(ctx, 30*time.Second, func() bool { return allKnowNodes(s, n) })
	if err != nil {
		known := make([]int, n)
		for i := range n {
			nodes, _ := s.Node(i).Nodes(ctx, "")
			known[i] = len(nodes)
		}
		t.Fatalf("node records did not reach every node: each knows %v of %d", known, n)
	}
	t.Logf("all %d records on all %d nodes after %v", n, n, took)
}
