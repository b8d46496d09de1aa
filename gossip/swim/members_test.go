package swim

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newTestMembers(self string, others ...string) *Members {
	m := NewMembers(Config{Self: self}, rand.New(rand.NewPCG(1, 2)))
	for _, o := range others {
		m.Add(o, t0)
	}
	return m
}

// TestApplyPrecedence: SWIM's rules for which claim wins, one update at a
// time against a member in a known state.
func TestApplyPrecedence(t *testing.T) {
	type st struct {
		s   State
		inc uint64
	}
	for _, c := range []struct {
		name   string
		before *st // nil: a stranger
		u      Update
		want   *st // nil: a stranger still
	}{
		{"alive from itself, stranger", nil, Update{Node: "b", State: Alive, Incarnation: 3, From: "b"}, &st{Alive, 3}},
		{"alive said by another", nil, Update{Node: "b", State: Alive, Incarnation: 3, From: "c"}, nil},
		{"alive, newer incarnation", &st{Suspect, 2}, Update{Node: "b", State: Alive, Incarnation: 3, From: "b"}, &st{Alive, 3}},
		{"alive, same incarnation, does not clear a suspicion", &st{Suspect, 2}, Update{Node: "b", State: Alive, Incarnation: 2, From: "b"}, &st{Suspect, 2}},
		{"alive, newer, after dead", &st{Dead, 2}, Update{Node: "b", State: Alive, Incarnation: 3, From: "b"}, &st{Alive, 3}},
		{"suspect, same incarnation", &st{Alive, 2}, Update{Node: "b", State: Suspect, Incarnation: 2, From: "c"}, &st{Suspect, 2}},
		{"suspect, older incarnation", &st{Alive, 2}, Update{Node: "b", State: Suspect, Incarnation: 1, From: "c"}, &st{Alive, 2}},
		{"suspect, newer incarnation", &st{Alive, 2}, Update{Node: "b", State: Suspect, Incarnation: 4, From: "c"}, &st{Suspect, 4}},
		{"suspect of a stranger", nil, Update{Node: "b", State: Suspect, Incarnation: 0, From: "c"}, nil},
		{"suspect of the dead", &st{Dead, 2}, Update{Node: "b", State: Suspect, Incarnation: 3, From: "c"}, &st{Dead, 2}},
		{"dead, same incarnation", &st{Suspect, 2}, Update{Node: "b", State: Dead, Incarnation: 2, From: "c"}, &st{Dead, 2}},
		{"dead, older incarnation", &st{Alive, 3}, Update{Node: "b", State: Dead, Incarnation: 2, From: "c"}, &st{Alive, 3}},
		{"dead of the left stays left", &st{Left, 2}, Update{Node: "b", State: Dead, Incarnation: 2, From: "c"}, &st{Left, 2}},
		{"left from itself", &st{Alive, 2}, Update{Node: "b", State: Left, Incarnation: 2, From: "b"}, &st{Left, 2}},
		{"left said by another", &st{Alive, 2}, Update{Node: "b", State: Left, Incarnation: 2, From: "c"}, &st{Alive, 2}},
		{"left, older incarnation", &st{Alive, 2}, Update{Node: "b", State: Left, Incarnation: 1, From: "b"}, &st{Alive, 2}},
		{"an unknown state", &st{Alive, 2}, Update{Node: "b", State: 9, Incarnation: 5, From: "b"}, &st{Alive, 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newTestMembers("a")
			if c.before != nil {
				m.members["b"] = &member{state: c.before.s, inc: c.before.inc, since: t0}
			}
			m.Apply([]Update{c.u}, t0)
			s, inc, ok := m.State("b")
			switch {
			case c.want == nil && ok:
				t.Fatalf("b is %v/%d, want a stranger", s, inc)
			case c.want != nil && (!ok || s != c.want.s || inc != c.want.inc):
				t.Fatalf("b is %v/%d (known %v), want %v/%d", s, inc, ok, c.want.s, c.want.inc)
			}
		})
	}
}

// TestRefute: a claim that this node is suspect or dead is answered with
// a higher incarnation (a stale one with the current); a leaving node
// refutes nothing.
func TestRefute(t *testing.T) {
	m := newTestMembers("a", "b")
	m.Announce(10)
	m.Piggyback()
	m.Apply([]Update{{Node: "a", State: Suspect, Incarnation: 10, From: "b"}}, t0)
	if _, inc, _ := m.State("a"); inc != 11 {
		t.Fatalf("incarnation %d after a suspicion of 10, want 11", inc)
	}
	if got := m.Piggyback(); len(got) != 1 || got[0].Node != "a" || got[0].State != Alive || got[0].Incarnation != 11 {
		t.Fatalf("spreading %+v, want a's alive at 11", got)
	}
	m.Apply([]Update{{Node: "a", State: Dead, Incarnation: 3, From: "b"}}, t0)
	if got := m.Piggyback(); len(got) != 1 || got[0].Incarnation != 11 || got[0].State != Alive {
		t.Fatalf("a stale death answered with %+v, want alive at 11", got)
	}
	m.Leave()
	m.Piggyback()
	m.Apply([]Update{{Node: "a", State: Dead, Incarnation: 11, From: "b"}}, t0)
	if s, inc, _ := m.State("a"); s != Left || inc != 11 {
		t.Fatalf("a leaving node is %v/%d", s, inc)
	}
	for _, u := range m.Piggyback() {
		if u.State == Alive {
			t.Fatalf("a leaving node refuted: %+v", u)
		}
	}
}

// TestRefuteOnlyVerifiedClaims: a claim about this node whose signature
// fails is counted bad and answered with nothing (it neither raises the
// incarnation nor makes the node think itself slow), and no update at or
// past MaxIncarnation is taken, not even a signed one: a refutation of
// it would wrap to 0, and the node would stay dead for everyone.
func TestRefuteOnlyVerifiedClaims(t *testing.T) {
	m := NewMembers(Config{Self: "a", Verify: func(u Update) bool { return string(u.Sig) == "ok" }}, rand.New(rand.NewPCG(1, 2)))
	m.Add("b", t0)
	m.Announce(10)
	for range 100 { // its alive spent
		if len(m.Piggyback()) == 0 {
			break
		}
	}
	for _, st := range []State{Suspect, Dead} {
		m.Apply([]Update{{Node: "a", State: st, Incarnation: MaxIncarnation - 1, From: "b", Sig: []byte("forged")}}, t0)
	}
	if inc, h, bad := m.Incarnation(), m.Health(), m.Bad(); inc != 10 || h != 0 || bad != 2 {
		t.Fatalf("after two forged claims: incarnation %d, health %d, bad %d; want 10, 0, 2", inc, h, bad)
	}
	if got := m.Piggyback(); len(got) != 0 {
		t.Fatalf("a forged claim answered with %+v", got)
	}
	m.Apply([]Update{
		{Node: "a", State: Dead, Incarnation: MaxIncarnation, From: "b", Sig: []byte("ok")},
		{Node: "b", State: Alive, Incarnation: math.MaxUint64, From: "b", Sig: []byte("ok")},
	}, t0)
	if inc, bad := m.Incarnation(), m.Bad(); inc != 10 || bad != 4 {
		t.Fatalf("after signed claims at MaxIncarnation and past it: incarnation %d, bad %d; want 10, 4", inc, bad)
	}
	if _, inc, _ := m.State("b"); inc >= MaxIncarnation {
		t.Fatalf("b taken at incarnation %d", inc)
	}
	if c := m.Counts(); c != (Counts{}) {
		t.Fatalf("forged and out-of-bounds claims counted as taken: %+v", c)
	}
	m.Apply([]Update{{Node: "a", State: Suspect, Incarnation: 10, From: "b", Sig: []byte("ok")}}, t0)
	if inc := m.Incarnation(); inc != 11 {
		t.Fatalf("a verified suspicion of 10 refuted at %d, want 11", inc)
	}
	if c := m.Counts(); c.Refuted != 1 || c.Applied != [Left + 1]int64{} {
		t.Fatalf("counts %+v after one refutation, want Refuted 1 and nothing applied", c)
	}
}

// TestProbeRounds: every alive or suspect member is probed once per
// round, in an order shuffled anew each round; dead and left ones never.
func TestProbeRounds(t *testing.T) {
	m := newTestMembers("a", "b", "c", "d", "e", "f")
	m.members["e"].state = Dead
	m.members["f"].state = Left
	m.members["d"].state = Suspect
	for round := range 5 {
		var picks []string
		for range 3 {
			node, ok := m.NextProbe()
			if !ok {
				t.Fatal("nothing to probe")
			}
			picks = append(picks, node)
		}
		if got := slices.Sorted(slices.Values(picks)); !slices.Equal(got, []string{"b", "c", "d"}) {
			t.Fatalf("round %d probed %v, want b, c and d once each", round, picks)
		}
	}
	seen := map[string]int{}
	m2 := newTestMembers("a", "b", "c", "d")
	for range 300 {
		node, _ := m2.NextProbe()
		seen[node]++
	}
	if seen["b"] != 100 || seen["c"] != 100 || seen["d"] != 100 {
		t.Fatalf("300 probes of 3 members: %v", seen)
	}
	if _, ok := newTestMembers("a").NextProbe(); ok {
		t.Fatal("a node alone probed someone")
	}
}

// TestSuspicionTimesOut: a suspicion ends dead at its maximum with no
// confirmations, sooner with them; a refutation in time clears it.
func TestSuspicionTimesOut(t *testing.T) {
	// 10 members: min 4 s, max 24 s, 2 confirmations expected.
	others := []string{"b", "c", "d", "e", "f", "g", "h", "i", "j"}
	m := newTestMembers("a", others...)
	m.ProbeFailed("b", t0)
	if s, _, _ := m.State("b"); s != Suspect {
		t.Fatalf("b is %v after a failed probe", s)
	}
	if ch := m.Tick(t0.Add(23900 * time.Millisecond)); len(ch) != 0 {
		t.Fatalf("dead before the maximum: %v", ch)
	}
	if ch := m.Tick(t0.Add(24 * time.Second)); len(ch) != 1 || ch[0] != (Change{"b", Dead}) {
		t.Fatalf("at the maximum: %v, want b dead", ch)
	}

	m.ProbeFailed("c", t0)
	m.Apply([]Update{{Node: "c", State: Suspect, From: "d"}, {Node: "c", State: Suspect, From: "d"}, {Node: "c", State: Suspect, From: "e"}}, t0.Add(time.Second))
	if ch := m.Tick(t0.Add(3900 * time.Millisecond)); len(ch) != 0 {
		t.Fatalf("dead before the minimum: %v", ch)
	}
	if ch := m.Tick(t0.Add(4 * time.Second)); len(ch) != 1 || ch[0] != (Change{"c", Dead}) {
		t.Fatalf("two confirmations: %v, want c dead at the minimum", ch)
	}

	m.ProbeFailed("d", t0)
	m.Apply([]Update{{Node: "d", State: Alive, Incarnation: 1, From: "d"}}, t0.Add(time.Second))
	if ch := m.Tick(t0.Add(time.Minute)); len(ch) != 0 {
		t.Fatalf("a refuted suspicion ended: %v", ch)
	}
	if s, inc, _ := m.State("d"); s != Alive || inc != 1 {
		t.Fatalf("d is %v/%d after refuting", s, inc)
	}
}

// TestVerify: an update whose signature fails changes nothing, is
// counted, and is not spread; one that changes nothing is not checked.
func TestVerify(t *testing.T) {
	checked := 0
	m := NewMembers(Config{Self: "a", Verify: func(u Update) bool { checked++; return string(u.Sig) == "ok" }}, rand.New(rand.NewPCG(1, 2)))
	m.Add("b", t0)
	m.Apply([]Update{{Node: "b", State: Dead, From: "c", Sig: []byte("forged")}}, t0)
	if s, _, _ := m.State("b"); s != Alive || m.Bad() != 1 || m.Pending() {
		t.Fatalf("a forged death: b %v, bad %d, pending %v", s, m.Bad(), m.Pending())
	}
	m.Apply([]Update{{Node: "b", State: Alive, Incarnation: 0, From: "b", Sig: []byte("forged")}}, t0)
	if checked != 1 {
		t.Fatalf("an update that changes nothing was checked (%d checks)", checked)
	}
	m.Apply([]Update{{Node: "b", State: Dead, From: "c", Sig: []byte("ok")}}, t0)
	if s, _, _ := m.State("b"); s != Dead {
		t.Fatalf("a signed death: b %v", s)
	}
}

// TestConfirmationsStopAtTheExpected: confirmations of a suspicion from
// new accusers are checked and spread until the expected number came (2
// at 10 members); later ones change nothing, are not checked, and are not
// spread.
func TestConfirmationsStopAtTheExpected(t *testing.T) {
	checked := 0
	m := NewMembers(Config{Self: "a", Verify: func(Update) bool { checked++; return true }}, rand.New(rand.NewPCG(1, 2)))
	for _, o := range []string{"b", "c", "d", "e", "f", "g", "h", "i", "j"} {
		m.Add(o, t0)
	}
	m.Apply([]Update{{Node: "b", State: Suspect, From: "c"}}, t0)
	for _, from := range []string{"d", "e"} {
		m.Apply([]Update{{Node: "b", State: Suspect, From: from}}, t0)
	}
	if checked != 3 {
		t.Fatalf("%d updates checked for a suspicion and 2 confirmations, want 3", checked)
	}
	for m.Pending() { // sent out
		m.Piggyback()
	}
	m.Apply([]Update{{Node: "b", State: Suspect, From: "f"}, {Node: "b", State: Suspect, From: "g"}}, t0)
	if checked != 3 || m.Pending() {
		t.Fatalf("confirmations past the expected: %d checks (want 3), pending %v (want false)", checked, m.Pending())
	}
	if c := m.Counts(); c.Applied[Suspect] != 1 || c.Confirmations != 2 || c.Applied[Alive] != 0 || c.Refuted != 0 {
		t.Fatalf("counts %+v, want 1 suspicion taken and 2 confirmations", c)
	}
	if left := suspicionLeft(len(m.members["b"].susp.from)-1, m.members["b"].susp.expects, 0, m.members["b"].susp.lo, m.members["b"].susp.hi); left != m.members["b"].susp.lo {
		t.Fatalf("timeout left %v with the expected confirmations, want the minimum %v", left, m.members["b"].susp.lo)
	}
}

// TestPiggybackLimits: a change is sent RetransmitMult × ceil(log10(N+1))
// times and no more, at most MaxPiggyback per message, the least sent
// first; a newer change about a member replaces the older.
func TestPiggybackLimits(t *testing.T) {
	m := NewMembers(Config{Self: "a", MaxPiggyback: 2}, rand.New(rand.NewPCG(1, 2)))
	for _, o := range []string{"b", "c", "d"} {
		m.Add(o, t0)
	}
	m.Apply([]Update{{Node: "b", State: Suspect, From: "x"}, {Node: "c", State: Suspect, From: "x"}, {Node: "d", State: Suspect, From: "x"}}, t0)
	m.Apply([]Update{{Node: "b", State: Alive, Incarnation: 1, From: "b"}}, t0)
	sent := map[string]int{}
	for range 20 {
		us := m.Piggyback()
		if len(us) > 2 {
			t.Fatalf("%d updates in one message", len(us))
		}
		for _, u := range us {
			sent[u.Node+"/"+u.State.String()]++
		}
	}
	// 4 members: 4 × ceil(log10 5) = 4 sends each.
	want := map[string]int{"b/alive": 4, "c/suspect": 4, "d/suspect": 4}
	if len(sent) != len(want) || sent["b/alive"] != 4 || sent["c/suspect"] != 4 || sent["d/suspect"] != 4 {
		t.Fatalf("sent %v, want %v", sent, want)
	}
}

// TestSnapshot: a snapshot holds the members that are not alive, with
// the updates that said so; a node that restarted (all members alive at
// incarnation 0) learns from it who is dead, suspect or left.
func TestSnapshot(t *testing.T) {
	old := newTestMembers("a", "b", "c", "d", "e")
	old.Apply([]Update{
		{Node: "b", State: Dead, Incarnation: 0, From: "c"},
		{Node: "c", State: Alive, Incarnation: 4, From: "c"},
		{Node: "d", State: Left, Incarnation: 0, From: "d"},
		{Node: "e", State: Suspect, Incarnation: 0, From: "c"},
	}, t0)
	snap := old.Snapshot()
	if len(snap) != 3 {
		t.Fatalf("snapshot %+v, want b, d and e", snap)
	}
	fresh := newTestMembers("x", "b", "c", "d", "e")
	fresh.ApplySnapshot(snap, t0)
	for node, want := range map[string]State{"b": Dead, "c": Alive, "d": Left, "e": Suspect} {
		if s, _, _ := fresh.State(node); s != want {
			t.Errorf("%s is %v after the snapshot, want %v", node, s, want)
		}
	}
}

// TestSnapshotCorrections: a node that missed b's refutation holds b dead
// in b's old incarnation, and its snapshot goes to a node that holds b
// alive in the new one; the answer carries b's own word, and b is alive
// again on the stale node. What the stale node holds right, or newer, is
// not answered.
func TestSnapshotCorrections(t *testing.T) {
	stale := newTestMembers("a", "b", "c", "d")
	stale.Apply([]Update{
		{Node: "b", State: Dead, Incarnation: 3, From: "c"},
		{Node: "d", State: Dead, Incarnation: 2, From: "c"},
	}, t0)
	knows := newTestMembers("x", "b", "c", "d")
	knows.Apply([]Update{
		{Node: "b", State: Alive, Incarnation: 4, From: "b"}, // b refuted
		{Node: "d", State: Alive, Incarnation: 2, From: "d"}, // older than d's death
	}, t0)
	fix := knows.Corrections(stale.Snapshot())
	if len(fix) != 1 || fix[0].Node != "b" || fix[0].State != Alive || fix[0].Incarnation != 4 || fix[0].From != "b" {
		t.Fatalf("corrections %+v, want b's own alive in incarnation 4 alone", fix)
	}
	stale.ApplySnapshot(fix, t0)
	if s, inc, _ := stale.State("b"); s != Alive || inc != 4 {
		t.Fatalf("b is %v/%d on the stale node after the correction, want alive/4", s, inc)
	}
	if s, _, _ := stale.State("d"); s != Dead {
		t.Fatalf("d is %v, want still dead: nobody knew better", s)
	}
}

// TestPiggybackToSuspect: a message to a member this node suspects
// carries the suspicion, even once its retransmissions are spent.
func TestPiggybackToSuspect(t *testing.T) {
	m := newTestMembers("a", "b", "c")
	m.ProbeFailed("b", t0)
	for range 20 {
		m.Piggyback() // spend the suspicion's retransmissions
	}
	if got := m.PiggybackTo("c"); len(got) != 0 {
		t.Fatalf("to c: %+v, want nothing", got)
	}
	got := m.PiggybackTo("b")
	if len(got) != 1 || got[0].Node != "b" || got[0].State != Suspect {
		t.Fatalf("to b: %+v, want its suspicion", got)
	}
}

// TestSuspectToTell: this node tells a suspect at most once a probe
// interval, whoever accused it, and only one that ok accepts.
func TestSuspectToTell(t *testing.T) {
	m := newTestMembers("a", "b", "c", "d")
	every := m.cfg.ProbeInterval
	all := func(string) bool { return true }
	if s, ok := m.SuspectToTell(t0, all); ok {
		t.Fatalf("told %s with no suspect", s)
	}
	m.Apply([]Update{{Node: "b", State: Suspect, From: "d"}}, t0) // d's accusation
	for _, c := range []struct {
		at   time.Duration
		ok   func(string) bool
		want string
	}{
		{0, func(string) bool { return false }, ""}, // b has a message in flight
		{0, all, "b"},
		{every / 2, all, ""}, // told half an interval ago
		{every - time.Millisecond, all, ""},
		{every, all, "b"},
		{every + time.Millisecond, all, ""},
		{3 * every, all, "b"},
	} {
		got, ok := m.SuspectToTell(t0.Add(c.at), c.ok)
		if got != c.want || ok != (c.want != "") {
			t.Errorf("at %v: %q %v, want %q", c.at, got, ok, c.want)
		}
	}
	// A new suspicion (a later incarnation) is told at once.
	m.Apply([]Update{{Node: "b", State: Alive, Incarnation: 1, From: "b"}}, t0.Add(4*every))
	m.ProbeFailed("b", t0.Add(4*every)) // this node's own
	if got, ok := m.SuspectToTell(t0.Add(4*every), all); !ok || got != "b" {
		t.Fatalf("a new suspicion of b: %q %v, want told", got, ok)
	}
}

// TestLocalHealth: the score stays within 0..AwarenessMax−1, stretches
// timeouts by score+1, and rises when this node must refute a suspicion.
func TestLocalHealth(t *testing.T) {
	m := NewMembers(Config{Self: "a", AwarenessMax: 4}, rand.New(rand.NewPCG(1, 2)))
	for _, c := range []struct {
		delta, want int
		scaled      time.Duration
	}{
		{-1, 0, time.Second}, // never below healthy
		{2, 2, 3 * time.Second},
		{5, 3, 4 * time.Second}, // never above AwarenessMax−1
		{-1, 2, 3 * time.Second},
	} {
		m.HealthDelta(c.delta)
		if m.Health() != c.want || m.Scale(time.Second) != c.scaled {
			t.Fatalf("after %+d: health %d, 1 s scaled to %v; want %d, %v", c.delta, m.Health(), m.Scale(time.Second), c.want, c.scaled)
		}
	}
	m.HealthDelta(-10)
	m.Apply([]Update{{Node: "a", State: Suspect, Incarnation: 0, From: "b"}}, t0)
	if m.Health() != 1 {
		t.Fatalf("health %d after refuting a suspicion, want 1", m.Health())
	}
}

// TestRandomOf: only members alive or suspect among the candidates, never
// this node, each at most once, at most k; and every candidate that
// qualifies comes up over many draws.
func TestRandomOf(t *testing.T) {
	m := newTestMembers("a", "b", "c", "d", "e", "f")
	m.ProbeFailed("c", t0) // suspect: still gossiped to
	m.Apply([]Update{{Node: "d", State: Dead, Incarnation: 0, From: "b"}}, t0)
	among := []string{"a", "b", "c", "d", "x", "b", "e"}
	seen := map[string]int{}
	for range 200 {
		got := m.RandomOf(2, among)
		if len(got) != 2 {
			t.Fatalf("RandomOf(2) = %v, want 2 of b, c, e", got)
		}
		if got[0] == got[1] {
			t.Fatalf("RandomOf(2) = %v: a node twice", got)
		}
		for _, n := range got {
			seen[n]++
		}
	}
	for n := range seen {
		if n != "b" && n != "c" && n != "e" {
			t.Fatalf("picked %q: not a member alive or suspect (seen %v)", n, seen)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("seen %v, want each of b, c, e", seen)
	}
	if got := m.RandomOf(3, []string{"a", "d", "x"}); len(got) != 0 {
		t.Fatalf("RandomOf of no member = %v, want none", got)
	}
	if !slices.Equal(among, []string{"a", "b", "c", "d", "x", "b", "e"}) {
		t.Fatalf("RandomOf reordered its argument: %v", among)
	}
}

// TestNextProbeNear: a neighbour that is a live member, else the round's
// next.
func TestNextProbeNear(t *testing.T) {
	m := newTestMembers("a", "b", "c", "d", "e")
	m.Apply([]Update{{Node: "e", State: Dead, From: "b"}}, t0)
	for range 20 {
		if got, _ := m.NextProbeNear([]string{"b", "e", "x"}); got != "b" {
			t.Fatalf("NextProbeNear = %q, want the one live neighbour b", got)
		}
	}
	seen := map[string]bool{}
	for range 4 {
		got, ok := m.NextProbeNear([]string{"x", "e"})
		if !ok || got == "e" || got == "x" {
			t.Fatalf("NextProbeNear with no neighbour a live member = %q, %v: want the round's next", got, ok)
		}
		seen[got] = true
	}
	if len(seen) != 3 {
		t.Fatalf("the round without neighbours: %v, want b, c, d", seen)
	}
}

// TestGone: what a helper tells a prober whose target did not answer is
// its signed word that the target left or is dead, and nothing for a
// member alive, suspect or unknown.
func TestGone(t *testing.T) {
	m := newTestMembers("a", "b", "c", "d", "e")
	dead := Update{Node: "b", State: Dead, Incarnation: 0, From: "c", Sig: []byte("c's")}
	left := Update{Node: "d", State: Left, Incarnation: 0, From: "d", Sig: []byte("d's")}
	m.Apply([]Update{dead, left, {Node: "e", State: Suspect, Incarnation: 0, From: "c"}}, t0)
	for _, c := range []struct {
		node string
		want Update
		ok   bool
	}{
		{"b", dead, true}, {"d", left, true}, {"c", Update{}, false}, {"e", Update{}, false}, {"z", Update{}, false},
	} {
		got, ok := m.Gone(c.node)
		if ok != c.ok || got.Node != c.want.Node || got.State != c.want.State || string(got.Sig) != string(c.want.Sig) {
			t.Errorf("Gone(%s) = %+v %v, want %+v %v", c.node, got, ok, c.want, c.ok)
		}
	}
}
