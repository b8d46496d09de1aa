package sim

import (
	"testing"
	"testing/synctest"
	"time"
)

// A node that joins a fleet is known to every node before its own mesh
// forms: it writes its record before it has any peer and holds it until
// two gossipsub heartbeats after the first joins the topic (2 s), but the
// peers it syncs with on joining pass it on at once. Simulated time, no
// DHT: 30 nodes up, the 31st joins three of them: 0.12 s, and 1.16 s
// without the relay.
func TestNewcomerKnownBeforeItsMeshForms(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 30
		s, err := New(Config{Nodes: n + 1, Seed: 41, Joins: 3, Latency: 10 * time.Millisecond, Net: SimNet, Sparse: true, Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		took := joinLate(t, s, time.Minute)
		relayed := int64(0)
		for i := range n {
			relayed += s.Node(i).Replica().SyncTotals().Relayed
		}
		t.Logf("every node held the newcomer's record %v after it started (simulated); %d entries relayed", took, relayed)
		if took >= time.Second {
			t.Fatalf("the fleet learnt of the newcomer only after %v: nobody passed its record on", took)
		}
	})
}
