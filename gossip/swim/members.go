package swim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// State is what a node believes of a member.
type State uint8

const (
	Alive   State = iota // answered lately, or said it is alive since the last suspicion
	Suspect              // failed a probe; dead unless it refutes in time
	Dead                 // suspected for the whole timeout, or declared dead
	Left                 // said it was leaving, before it went
)

var stateNames = [...]string{"alive", "suspect", "dead", "left"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", s)
}

// Update is one claim about a member, the unit of gossip. Alive and Left
// are said by the member itself (From == Node); Suspect and Dead by an
// accuser (From). Sig is From's signature over the rest (Config.Sign).
type Update struct {
	Node        string
	State       State
	Incarnation uint64
	From        string
	Sig         []byte
}

// Message is what one node sends another: a probe, an ack, or gossip,
// each carrying the changes the sender is spreading.
type Message struct {
	Updates []Update
}

// Config tunes the detector; zero fields take DefaultConfig's values.
type Config struct {
	// Self is this node's name among the members.
	Self string
	// ProbeInterval: one probe of one member per interval.
	ProbeInterval time.Duration
	// ProbeTimeout: an ack later than this fails the direct probe. It is
	// a round trip plus the time to open a stream, with room for a
	// retransmission or two.
	ProbeTimeout time.Duration
	// IndirectChecks: members asked to probe one that did not answer.
	IndirectChecks int
	// SuspicionMult scales the minimum suspicion (× log10 N ×
	// ProbeInterval), SuspicionMaxMult the maximum (× the minimum).
	SuspicionMult, SuspicionMaxMult int
	// RetransmitMult: a change is sent RetransmitMult × ceil(log10(N+1))
	// times.
	RetransmitMult int
	// GossipInterval and GossipNodes: while there are changes to spread,
	// they are also sent to GossipNodes random members every interval
	// (piggybacking alone would wait for probes).
	GossipInterval time.Duration
	GossipNodes    int
	// Neighbours, if set, names the members this node reaches without
	// setting anything up (over a connection it holds). Gossip goes to
	// them, and to others only when none of them is a member: on a
	// transport whose messages ride connections, gossip to random members
	// would open one to every member within seconds of a change (a
	// start-up storm of handshakes), while an epidemic over the
	// connections a node holds reaches everyone as fast. Probes, and the
	// word to a suspect that it is suspected, go to whoever they must.
	// Probes follow it too (see FarProbeEvery), and so do the helpers of
	// an indirect probe. It must be safe for concurrent use and cheap
	// (every probe, and every GossipInterval while there are changes to
	// spread).
	Neighbours func() []string
	// FarProbeEvery, with Neighbours set: one probe in FarProbeEvery goes
	// to the next member of the round over all members (SWIM's, which
	// may cost a connection), the others to a neighbour at random. A
	// member none holds a connection to is still probed by someone every
	// few rounds.
	FarProbeEvery int
	// MaxPiggyback caps the updates in one message (the others wait);
	// MaxUpdates caps what a received message may hold.
	MaxPiggyback, MaxUpdates int
	// AwarenessMax bounds Lifeguard's local health score: a node that
	// misses its own acks and nacks (it is the slow one: CPU starved, its
	// network congested) stretches its probe interval and timeout up to
	// AwarenessMax times instead of accusing healthy members.
	AwarenessMax int
	// Sign signs an update this node says (its own alive or left, an
	// accusation); nil leaves updates unsigned. It must be safe for
	// concurrent use.
	Sign func(Update) []byte
	// Verify checks an update's signature before it changes anything;
	// nil accepts all. It must be safe for concurrent use.
	Verify func(Update) bool
}

// DefaultConfig is tuned for a fleet on one LAN or a few: memberlist's
// LAN values, with a longer probe timeout since a probe opens a stream.
func DefaultConfig() Config {
	return Config{
		ProbeInterval:    time.Second,
		ProbeTimeout:     500 * time.Millisecond,
		IndirectChecks:   3,
		SuspicionMult:    4,
		SuspicionMaxMult: 6,
		RetransmitMult:   4,
		GossipInterval:   200 * time.Millisecond,
		GossipNodes:      3,
		MaxPiggyback:     16,
		MaxUpdates:       64,
		AwarenessMax:     8,
		FarProbeEvery:    8,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	set := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	setD := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	setD(&c.ProbeInterval, d.ProbeInterval)
	setD(&c.ProbeTimeout, d.ProbeTimeout)
	setD(&c.GossipInterval, d.GossipInterval)
	set(&c.IndirectChecks, d.IndirectChecks)
	set(&c.SuspicionMult, d.SuspicionMult)
	set(&c.SuspicionMaxMult, d.SuspicionMaxMult)
	set(&c.RetransmitMult, d.RetransmitMult)
	set(&c.GossipNodes, d.GossipNodes)
	set(&c.MaxPiggyback, d.MaxPiggyback)
	set(&c.MaxUpdates, d.MaxUpdates)
	set(&c.AwarenessMax, d.AwarenessMax)
	set(&c.FarProbeEvery, d.FarProbeEvery)
	return c
}

// Validate reports what is wrong with c, changing nothing.
func (c Config) Validate() error {
	switch {
	case c.Self == "":
		return errors.New("swim: Self is empty")
	case c.ProbeTimeout > 0 && c.ProbeInterval > 0 && c.ProbeTimeout >= c.ProbeInterval:
		return fmt.Errorf("swim: probe timeout %v is not below the probe interval %v", c.ProbeTimeout, c.ProbeInterval)
	}
	return nil
}

// Change is a member's state as it changed here.
type Change struct {
	Node  string
	State State
}

// member is what the core knows of one member.
type member struct {
	state State
	inc   uint64
	since time.Time // when it entered this state here
	susp  *suspicion
	last  Update // the update that put it in this state; none for Add's
}

// suspicion is a running suspicion: who confirmed it, and its bounds.
type suspicion struct {
	start   time.Time
	from    map[string]bool
	lo, hi  time.Duration
	expects int       // confirmations that would bring the timeout to lo
	told    time.Time // when this node last told the suspect (SuspectToTell)
}

// Members is the pure core: the membership one node believes, the changes
// it spreads, and the order it probes in. It is not safe for concurrent
// use (Detector serialises it); it never blocks, sleeps or reads a clock.
type Members struct {
	cfg     Config
	rng     *rand.Rand
	inc     uint64 // this node's incarnation
	leaving bool
	members map[string]*member
	names   []string        // the members' names, in no order: what Random draws from
	index   map[string]int  // a name's place in names
	suspect map[string]bool // the members under suspicion: all Tick looks at
	order   []string        // this round's probe order
	next    int
	queue   queue
	bad     int64 // updates that failed Verify
	health  int   // Lifeguard's local health score, 0 (healthy) to AwarenessMax−1
	counts  Counts
}

// Counts is what the core took and said: the claims that changed what
// this node believes, by the state they claim (a confirmation of a
// suspicion held counts apart), and the claims about this node it
// refuted. In a fleet that is too loaded, suspicions and refutations
// churn, each a signature checked by every node: these say how fast.
type Counts struct {
	Applied       [Left + 1]int64
	Confirmations int64
	Refuted       int64
}

// NewMembers returns the core for cfg.Self, drawing randomness from rng.
func NewMembers(cfg Config, rng *rand.Rand) *Members {
	return &Members{cfg: cfg.withDefaults(), rng: rng, members: map[string]*member{},
		index: map[string]int{}, suspect: map[string]bool{}}
}

// Len is the number of members known, this node included.
func (m *Members) Len() int { return len(m.members) + 1 }

// Bad is how many updates failed their signature check.
func (m *Members) Bad() int64 { return m.bad }

// Counts is what the core took and said so far.
func (m *Members) Counts() Counts { return m.counts }

// Health is the local health score: 0 when this node's probes go as
// expected, up to AwarenessMax−1 when it keeps missing answers itself.
func (m *Members) Health() int { return m.health }

// HealthDelta moves the local health score by d, within its bounds:
// Lifeguard's awareness. The shell calls it with a probe's outcome (see
// probeHealthDelta); a refutation here raises it too.
func (m *Members) HealthDelta(d int) {
	m.health = min(max(m.health+d, 0), m.cfg.AwarenessMax-1)
}

// Scale stretches a probe's timeout or interval by the local health
// score: d × (score+1).
func (m *Members) Scale(d time.Duration) time.Duration {
	return d * time.Duration(m.health+1)
}

// State is what this node believes of node; ok is false for a node it
// has never heard of.
func (m *Members) State(node string) (s State, inc uint64, ok bool) {
	if node == m.cfg.Self {
		if m.leaving {
			return Left, m.inc, true
		}
		return Alive, m.inc, true
	}
	mb, ok := m.members[node]
	if !ok {
		return 0, 0, false
	}
	return mb.state, mb.inc, true
}

// Add makes node a member, alive, unless it is known already: the node
// learned of it elsewhere (its record arrived). It is not gossiped: the
// member says it is alive itself when someone asks.
func (m *Members) Add(node string, now time.Time) {
	if node == m.cfg.Self || m.members[node] != nil {
		return
	}
	m.insert(node, &member{state: Alive, since: now})
}

func (m *Members) insert(node string, mb *member) {
	m.members[node] = mb
	m.index[node] = len(m.names)
	m.names = append(m.names, node)
}

// Remove forgets node (it was reaped): it is no longer probed, and
// updates about it are taken as about a stranger.
func (m *Members) Remove(node string) {
	i, ok := m.index[node]
	if !ok {
		return
	}
	last := m.names[len(m.names)-1]
	m.names[i], m.index[last] = last, i
	m.names = m.names[:len(m.names)-1]
	delete(m.index, node)
	delete(m.members, node)
	delete(m.suspect, node)
	m.queue.drop(node)
}

// probeable reports whether node is probed: alive or suspect.
func (mb *member) probeable() bool { return mb.state == Alive || mb.state == Suspect }

// NextProbe is the member to probe now: the next of a shuffled round of
// all alive and suspect members (a new round, newly shuffled, when one
// ends), so every member is probed once a round.
func (m *Members) NextProbe() (string, bool) {
	for range 2 {
		for m.next < len(m.order) {
			node := m.order[m.next]
			m.next++
			if mb := m.members[node]; mb != nil && mb.probeable() {
				return node, true
			}
		}
		m.order = append(m.order[:0], m.names...)
		m.rng.Shuffle(len(m.order), func(i, j int) { m.order[i], m.order[j] = m.order[j], m.order[i] })
		m.next = 0
	}
	return "", false
}

// NextProbeNear is the member to probe now on a probe that stays with
// the neighbours (see Config.FarProbeEvery): a neighbour at random, else
// the next of the round.
func (m *Members) NextProbeNear(near []string) (string, bool) {
	if to := m.RandomOf(1, near); len(to) == 1 {
		return to[0], true
	}
	return m.NextProbe()
}

// Random is up to k alive members (and suspect ones too, if suspects)
// other than the ones in skip, chosen at random: the helpers of an
// indirect probe, or where gossip goes (a suspect must hear of it to
// refute it).
func (m *Members) Random(k int, suspects bool, skip ...string) []string {
	var out []string
	ok := func(node string) bool {
		mb := m.members[node]
		return (mb.state == Alive || (suspects && mb.state == Suspect)) && !contains(skip, node) && !contains(out, node)
	}
	// Random draws first: a draw costs the same in a fleet of 5,000 as of
	// 5. Only where most are dead or skipped does it come to a scan.
	for range 4 * k {
		if len(out) == k || len(m.names) == 0 {
			return out
		}
		if node := m.names[m.rng.IntN(len(m.names))]; ok(node) {
			out = append(out, node)
		}
	}
	seen := len(out)
	for _, node := range m.names {
		if !ok(node) {
			continue
		}
		seen++
		if len(out) < k {
			out = append(out, node)
		} else if j := m.rng.IntN(seen); j < k {
			out[j] = node
		}
	}
	return out
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// ProbeFailed starts a suspicion of node: neither it nor any helper
// answered a probe.
func (m *Members) ProbeFailed(node string, now time.Time) []Change {
	mb := m.members[node]
	if mb == nil || mb.state != Alive {
		return nil // already suspect (its timer runs), or gone
	}
	return m.Apply([]Update{m.sign(Update{Node: node, State: Suspect, Incarnation: mb.inc, From: m.cfg.Self})}, now)
}

// sign completes an update this node says.
func (m *Members) sign(u Update) Update {
	if m.cfg.Sign != nil {
		u.Sig = m.cfg.Sign(u)
	}
	return u
}

// Apply takes updates heard from another node (or said here): those that
// change what this node believes are checked (Verify), applied and
// spread on; the rest are dropped. Claims about this node are refuted. It
// returns the members whose state changed.
func (m *Members) Apply(us []Update, now time.Time) []Change {
	var changes []Change
	for i, u := range us {
		if i == m.cfg.MaxUpdates {
			break
		}
		if c, ok := m.apply(u, now); ok {
			changes = append(changes, c)
		}
	}
	return changes
}

func (m *Members) apply(u Update, now time.Time) (Change, bool) {
	if u.Incarnation >= MaxIncarnation {
		m.bad++ // no node says that: one more refutation would wrap
		return Change{}, false
	}
	if u.Node == m.cfg.Self {
		// A claim about this node is checked before it is answered:
		// a forged accusation must not raise the incarnation or make
		// this node think itself slow.
		if m.leaving || (u.State != Suspect && u.State != Dead) {
			return Change{}, false
		}
		if m.cfg.Verify != nil && !m.cfg.Verify(u) {
			m.bad++
			return Change{}, false
		}
		m.refute(u)
		m.counts.Refuted++
		return Change{}, false
	}
	mb := m.members[u.Node]
	confirm := false
	switch u.State {
	case Alive, Left:
		if u.From != u.Node || (mb != nil && u.Incarnation <= mb.inc && !(u.State == Left && mb.state != Left && u.Incarnation == mb.inc)) {
			return Change{}, false
		}
	case Suspect:
		switch {
		case mb == nil || mb.state == Dead || mb.state == Left || u.Incarnation < mb.inc:
			return Change{}, false
		case mb.state == Suspect && u.Incarnation == mb.inc:
			// A confirmation counts once per accuser, and only until
			// the expected ones came (the timeout is then at its
			// minimum): past that it is neither checked nor spread,
			// as memberlist's Confirm. Every prober of a member that
			// a loaded fleet suspects accuses it too, and each
			// accusation spread is a signature every node checks.
			if mb.susp.from[u.From] || len(mb.susp.from)-1 >= mb.susp.expects {
				return Change{}, false
			}
			confirm = true
		}
	case Dead:
		if mb == nil || mb.state == Dead || mb.state == Left || u.Incarnation < mb.inc {
			return Change{}, false
		}
	default:
		return Change{}, false
	}
	if m.cfg.Verify != nil && !m.cfg.Verify(u) {
		m.bad++
		return Change{}, false
	}
	m.queue.push(u)
	if confirm {
		mb.susp.from[u.From] = true
		m.counts.Confirmations++
		return Change{}, false
	}
	m.counts.Applied[u.State]++
	if mb == nil {
		mb = &member{}
		m.insert(u.Node, mb)
	}
	mb.state, mb.inc, mb.since, mb.susp, mb.last = u.State, u.Incarnation, now, nil, u
	delete(m.suspect, u.Node)
	if u.State == Suspect {
		m.suspect[u.Node] = true
		n := m.Len()
		lo := suspicionMin(m.cfg.SuspicionMult, n, m.cfg.ProbeInterval)
		// memberlist's expectation: SuspicionMult − 2 confirmations, as
		// many as can arrive before the minimum timeout runs out.
		expects := max(0, min(m.cfg.SuspicionMult-2, n-2))
		mb.susp = &suspicion{start: now, from: map[string]bool{u.From: true}, lo: lo,
			hi: time.Duration(m.cfg.SuspicionMaxMult) * lo, expects: expects}
	}
	return Change{Node: u.Node, State: u.State}, true
}

// MaxIncarnation bounds the incarnations a node takes: an update of this
// one or higher is refused and counted bad. A node starts from the Unix
// time in milliseconds (about 2^41) and adds one per refutation, so no
// honest node comes near; without the bound, a claim at the largest
// uint64 would make the refutation wrap to 0, which nobody believes.
const MaxIncarnation = math.MaxUint64 / 2

// refute answers a verified claim about this node: a suspicion or a death of its
// current incarnation or a later one is answered with a higher
// incarnation, alive (unless it is leaving); one of an older incarnation
// with the current one, for whoever missed it (a member that learned of
// this node from its record knows no incarnation yet).
func (m *Members) refute(u Update) {
	if u.Incarnation >= m.inc {
		m.inc = u.Incarnation + 1
	}
	// Others took this node for failed: it may be the slow one.
	m.HealthDelta(1)
	m.queue.push(m.sign(Update{Node: m.cfg.Self, State: Alive, Incarnation: m.inc, From: m.cfg.Self}))
}

// Announce spreads that this node is alive, in a new incarnation: it
// (re)started, and anyone who declared it dead must hear otherwise.
func (m *Members) Announce(inc uint64) {
	m.inc = max(m.inc, inc)
	m.queue.push(m.sign(Update{Node: m.cfg.Self, State: Alive, Incarnation: m.inc, From: m.cfg.Self}))
}

// Incarnation is this node's incarnation.
func (m *Members) Incarnation() uint64 { return m.inc }

// Leave marks this node leaving: it says so (Left) to whoever it talks to
// next and refutes nothing after. It returns that update.
func (m *Members) Leave() Update {
	m.leaving = true
	u := m.sign(Update{Node: m.cfg.Self, State: Left, Incarnation: m.inc, From: m.cfg.Self})
	m.queue.push(u)
	return u
}

// Tick ends the suspicions whose time ran out: those members are dead,
// and this node says so.
func (m *Members) Tick(now time.Time) []Change {
	var dead []Update
	for node := range m.suspect {
		if mb := m.members[node]; suspicionLeft(len(mb.susp.from)-1, mb.susp.expects, now.Sub(mb.susp.start), mb.susp.lo, mb.susp.hi) == 0 {
			dead = append(dead, m.sign(Update{Node: node, State: Dead, Incarnation: mb.inc, From: m.cfg.Self}))
		}
	}
	return m.Apply(dead, now)
}

// RandomOf is up to k of the nodes among, at random, that are members
// alive or suspect (not this node).
func (m *Members) RandomOf(k int, among []string) []string {
	among = slices.Clone(among)
	var out []string
	for i := 0; i < len(among) && len(out) < k; i++ {
		j := i + m.rng.IntN(len(among)-i)
		among[i], among[j] = among[j], among[i]
		mb := m.members[among[i]]
		if mb != nil && (mb.state == Alive || mb.state == Suspect) && !contains(out, among[i]) {
			out = append(out, among[i])
		}
	}
	return out
}

// Suspects is how many members are under suspicion.
func (m *Members) Suspects() int { return len(m.suspect) }

// SuspectToTell is a member to tell now that it is suspected, at random
// among those this node last told a ProbeInterval ago or more (and that
// ok accepts), and marks it told. The suspect must hear of it to refute
// it, from whoever holds the suspicion (a rule that left the telling to
// the accuser alone once took 50 agents starting at once 67 s to agree,
// a suspect whose one teller was slow waiting for a snapshot). But told
// at every gossip round by each neighbour that held the suspicion, a
// member suspected because it was slow (CPU starved, as when a machine's
// agents start at once) got five messages a second from each of them,
// the very load that kept it from answering.
func (m *Members) SuspectToTell(now time.Time, ok func(node string) bool) (string, bool) {
	pick, seen := "", 0
	for node := range m.suspect {
		s := m.members[node].susp
		if s == nil || now.Sub(s.told) < m.cfg.ProbeInterval || !ok(node) {
			continue
		}
		seen++
		if m.rng.IntN(seen) == 0 {
			pick = node
		}
	}
	if seen == 0 {
		return "", false
	}
	m.members[pick].susp.told = now
	return pick, true
}

// Pending reports whether there are changes left to spread.
func (m *Members) Pending() bool { return m.queue.len() > 0 }

// Piggyback is what to send with the next message: up to MaxPiggyback of
// the changes sent the fewest times so far, each counted as sent once
// more and dropped when sent RetransmitMult × ceil(log10(N+1)) times.
func (m *Members) Piggyback() []Update {
	return m.queue.take(m.cfg.MaxPiggyback, retransmits(m.cfg.RetransmitMult, m.Len()))
}

// PiggybackTo is Piggyback for a message to node, plus this node's
// suspicion of it, if it holds one: the suspect hears of it from whoever
// probes it, and its ack carries the refutation back. Else a suspicion
// raised while the fleet was too busy to deliver its gossip (as in a
// start-up storm) would stand until it timed out, the suspect never told.
func (m *Members) PiggybackTo(node string) []Update {
	us := m.Piggyback()
	if mb := m.members[node]; mb != nil && mb.state == Suspect && mb.last.Node == node {
		for _, u := range us {
			if u.Node == node && u.State == Suspect && u.Incarnation == mb.inc {
				return us
			}
		}
		us = append(us, mb.last)
	}
	return us
}

// Gone is the signed update that says node left or is dead, if this node
// holds it so: what a helper tells a prober whose target did not answer.
func (m *Members) Gone(node string) (Update, bool) {
	mb := m.members[node]
	if mb == nil || (mb.state != Left && mb.state != Dead) || mb.last.Node == "" {
		return Update{}, false
	}
	return mb.last, true
}

// MaxSnapshot caps the updates of one snapshot.
const MaxSnapshot = 8192

// Snapshot is what a node that starts (or any node, now and then) needs
// to hear besides the records: the members that are not alive, each with
// the signed update that says so. A node that restarted takes every
// member with a record for alive; this tells it who is not, and the
// members it wrongly holds dead hear of it (the update spreads again) and
// refute. Alive members travel in their own announcements.
func (m *Members) Snapshot() []Update {
	var out []Update
	for _, node := range m.names {
		if mb := m.members[node]; mb.state != Alive && mb.last.Node != "" {
			out = append(out, mb.last)
			if len(out) == MaxSnapshot {
				break
			}
		}
	}
	return out
}

// Corrections answers another node's Snapshot: for each member it holds
// suspect, dead or left in an older incarnation than this node knows, the
// signed update that says what this node holds (the member's own word,
// alive again in a newer incarnation). Without it a node that missed a
// refutation, while the fleet was too busy to carry every message, held
// the member dead for good: its snapshot went to peers that knew better
// and dropped it, and a dead member is no longer probed. The answer is at
// most MaxSnapshot updates.
func (m *Members) Corrections(us []Update) []Update {
	var out []Update
	for _, u := range us[:min(len(us), MaxSnapshot)] {
		mb := m.members[u.Node]
		if mb == nil || mb.last.Node == "" || mb.inc <= u.Incarnation || u.State == Alive {
			continue
		}
		out = append(out, mb.last)
	}
	return out
}

// ApplySnapshot takes another node's Snapshot, as Apply takes a message
// (with no cap of MaxUpdates).
func (m *Members) ApplySnapshot(us []Update, now time.Time) []Change {
	var changes []Change
	for _, u := range us[:min(len(us), MaxSnapshot)] {
		if c, ok := m.apply(u, now); ok {
			changes = append(changes, c)
		}
	}
	return changes
}
