package node

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins/tasks"
	"github.com/tribeagent/tribe/policy"
)

// Values of the replicated keys (JSON).

// nodeRecord is nodes/<peer>: what a node says of itself.
type nodeRecord struct {
	Name    string          `json:"name"`
	Addrs   []string        `json:"addrs"`
	Version string          `json:"version"`
	Facts   json.RawMessage `json:"facts,omitempty"`
	// Plugins is how loading went for each "<tribe>/<plugin>" this node
	// was asked to run (see plugins.go).
	Plugins map[string]pluginStatus `json:"plugins,omitempty"`
	// Tasks is how each "<tribe>/<task>" this node runs goes (tasks.go).
	Tasks map[string]tasks.Status `json:"tasks,omitempty"`
	// Left says the node left the cluster cleanly at LeftAt (its clock):
	// the last record it writes before it stops (see reap.go).
	Left   bool      `json:"left,omitempty"`
	LeftAt time.Time `json:"left_at,omitzero"`

	raw []byte // the record as stored, where its facts are read from when Facts was left out (recordAt)
}

// tribeRecord is tribes/<t>: an explicitly created tribe.
type tribeRecord struct {
	CreatedBy string `json:"created_by"`
}

// memberRecord is tribes/<t>/members/<peer>/{manual,policy}. Leaving
// deletes the key.
type memberRecord struct {
	Policies []string `json:"policies,omitempty"`
}

const (
	nodesPrefix  = "nodes/"
	tribesPrefix = "tribes/"
)

// Errors the API reports as the caller's.
var (
	ErrUnknownTribe = errors.New("unknown tribe")
	ErrUnknownNode  = errors.New("unknown node")
)

// ErrRecordTooLarge is returned for a node record over the size limit of
// a value in the replicated state (gossip.MaxValueLen), mostly for its facts.
var ErrRecordTooLarge = errors.New("node: own record over the size limit")

// publishSelf writes this node's record, with its current facts, if it
// differs from the stored one.
func (n *Node) publishSelf(ctx context.Context) error {
	n.recordMu.Lock()
	defer n.recordMu.Unlock()
	b, err := n.encodeRecord(n.facts.get())
	if err != nil {
		return err
	}
	return n.putRecord(ctx, b)
}

// adoptFacts makes facts the node's own if they differ from its current
// ones, all or nothing: the record with them is encoded, checked against
// the size limit (else ErrFactsRefused) and written first, and only then
// do the policies and the facts plugin see them. It reports whether the
// facts changed.
func (n *Node) adoptFacts(ctx context.Context, facts policy.Facts) (changed bool, err error) {
	n.recordMu.Lock()
	defer n.recordMu.Unlock()
	if reflect.DeepEqual(n.facts.get(), facts) {
		return false, nil
	}
	b, err := n.encodeRecord(facts)
	if err != nil {
		return false, refused(err)
	}
	if err := n.putRecord(ctx, b); err != nil {
		return false, fmt.Errorf("node: write own record: %w", err)
	}
	n.facts.set(facts)
	return true, nil
}

// encodeRecord is this node's record as it would be written with facts;
// one that could not be written (over gossip.MaxValueLen) is an error.
func (n *Node) encodeRecord(facts policy.Facts) ([]byte, error) {
	fb, err := json.Marshal(facts)
	if err != nil {
		return nil, fmt.Errorf("node: encode facts: %w", err)
	}
	// As other nodes will read them: facts past policy's bounds would be
	// none there.
	if _, err := policy.DecodeJSON(fb); err != nil {
		return nil, fmt.Errorf("node: facts other nodes would refuse: %w", err)
	}
	// An address that is not printable text (an IPv6 zone named oddly)
	// would make other nodes refuse the whole record (checkRecord).
	addrs := slices.DeleteFunc(p2pAddrs(n.host.ID(), n.host.Addrs()), func(a string) bool { return !names.Printable(a) })
	return n.encodeOwn(nodeRecord{Name: n.cfg.Name, Addrs: addrs, Version: Version, Facts: fb,
		Plugins: n.plugins.status(n.registry.Source), Tasks: n.tasks.statuses(), Left: !n.leftAt.IsZero(), LeftAt: n.leftAt})
}

// encodeOwn encodes rec, this node's record, as peers will take it: its
// tasks' errors left out if they would make it too large, its facts
// withheld if peers would not take it from a node that does not count
// yet; an error if it is still too large, or would be refused.
func (n *Node) encodeOwn(rec nodeRecord) ([]byte, error) {
	fb := rec.Facts
	var b []byte
	encode := func() (err error) {
		if b, err = json.Marshal(rec); err != nil {
			return fmt.Errorf("node: encode own record: %w", err)
		}
		return nil
	}
	if err := encode(); err != nil {
		return nil, err
	}
	if len(b) > gossip.MaxValueLen && len(rec.Tasks) > 0 {
		// Many failing tasks' errors must not keep this node from
		// writing its record (its facts, its leaving): they go first.
		for k, st := range rec.Tasks {
			st.Error = ""
			rec.Tasks[k] = st
		}
		if err := encode(); err != nil {
			return nil, err
		}
	}
	if len(b) > gossip.MaxPendingRecord && !n.rules().Counts(n.host.ID()) {
		// Peers take no record this large from a node that does not
		// count: until it counts, its facts are withheld, so that it
		// is listed pending and can be admitted (by hand: an
		// --auto-admit expression sees no facts). Admitted, it writes
		// them (announceOwn).
		rec.Facts = json.RawMessage(`{}`)
		if err := encode(); err != nil {
			return nil, err
		}
		n.authWarn.warn(n.log, "own facts", "this node's record is too large for peers to take before it is admitted: its facts are withheld until it is (admit it by hand; shrink its facts for --auto-admit to see them)",
			"limit", gossip.MaxPendingRecord)
	}
	if err := checkRecord(b); err != nil { // as other nodes will check it
		return nil, fmt.Errorf("node: own record other nodes would refuse: %w", err)
	}
	if len(b) > gossip.MaxValueLen {
		hint := ""
		if f := n.settings().factsFile; f != "" {
			hint = fmt.Sprintf(" (shrink the facts file %s)", f)
		}
		return nil, fmt.Errorf("%w: it would be %d bytes, %d of them facts, over the %d-byte limit%s",
			ErrRecordTooLarge, len(b), len(fb), gossip.MaxValueLen, hint)
	}
	return b, nil
}

// putRecord writes b as this node's record unless it is stored already.
// The caller holds recordMu.
func (n *Node) putRecord(ctx context.Context, b []byte) error {
	key := nodesPrefix + n.host.ID().String()
	cur, ok := n.replica.Version(key)
	if ok && !cur.Deleted && string(cur.Value) == string(b) {
		return nil
	}
	if ok && !n.rules().Counts(n.host.ID()) {
		// Peers take a new version of a record of a node that does not
		// count only gossip.PendingRewrite after the one before: it is
		// written then (recordLoop), not now to be refused.
		if wait := gossip.PendingRewrite - n.now().Sub(cur.HLC.Wall()) + time.Millisecond; wait > 0 {
			if n.recordLater == nil {
				n.recordLater = time.AfterFunc(wait, n.pokeRecord)
			} else {
				n.recordLater.Reset(wait)
			}
			return nil
		}
	}
	s, err := n.replica.Put(ctx, key, b)
	if err == nil && len(s.Value) > gossip.MaxPendingRecord && !n.rules().Counts(n.host.ID()) {
		// Its facts withheld, and still too large (its addresses).
		n.authWarn.warn(n.log, "own record", "this node's record is too large for peers to take before it is admitted, even without its facts: they will not list it as pending",
			"bytes", len(s.Value), "limit", gossip.MaxPendingRecord)
	}
	return err
}

// pokeRecord has recordLoop write this node's record now.
func (n *Node) pokeRecord() {
	select {
	case n.recordNow <- struct{}{}:
	default:
	}
}

// nodeRecords returns every node's record by peer, bad records skipped.
func (n *Node) nodeRecords() map[peer.ID]nodeRecord {
	out := map[peer.ID]nodeRecord{}
	for _, e := range n.replica.Prefix(nodesPrefix) {
		if c, ok := n.recordAt(e); ok && !c.bad {
			out[c.id] = c.rec
		}
	}
	return out
}

// cachedRecord is a node's record entry decoded: its peer (and that as a
// string), and the record without its facts (nodeRecord.facts reads them
// from the entry when asked). bad: the record did not decode whole. Every
// reader shares the record's slices and maps: read them, never change them.
type cachedRecord struct {
	entry *gossip.Signed
	id    peer.ID
	idStr string
	rec   nodeRecord
	bad   bool
}

// recordAt decodes the node record entry e (at nodes/<peer>), or returns
// it decoded before: an entry is replaced, never changed, when its node
// writes a new record, so what was decoded is kept by state key with its
// entry, and dropped when the key is deleted (names.go). Every view of
// the fleet reads every record: `tribe nodes` on 50 nodes took 2.2 ms of
// the agent's CPU when each call decoded them all (and turned each peer
// ID into text three times). ok is false for a key that names no peer.
func (n *Node) recordAt(e *gossip.Signed) (cachedRecord, bool) {
	if v, ok := n.records.Load(e.Key); ok && v.(*cachedRecord).entry == e {
		return *v.(*cachedRecord), true
	}
	id, err := peer.Decode(strings.TrimPrefix(e.Key, nodesPrefix))
	if err != nil {
		return cachedRecord{}, false
	}
	c := &cachedRecord{entry: e, id: id, idStr: id.String()}
	// A value that is not whole decodes as far as it goes: its name is
	// still its name (nodeNamed), but the record is skipped as a whole.
	c.bad = json.Unmarshal(e.Value, &c.rec) != nil
	c.rec.Facts, c.rec.raw = nil, e.Value
	n.records.Store(e.Key, c)
	if cur, ok := n.replica.Get(e.Key); !ok || cur != e {
		// Replaced or deleted meanwhile: its watcher may have dropped
		// the cache before the Store above (at worst a newer entry's
		// goes too, and is decoded again).
		n.records.CompareAndDelete(e.Key, c)
	}
	return *c, true
}

// Nodes implements api.Agent: the fleet, optionally filtered by a CEL
// expression over each node's facts.
func (n *Node) Nodes(ctx context.Context, where string) ([]api.Node, error) {
	return n.nodes(ctx, where, false)
}

// NodesWithFacts implements api.Agent: Nodes with each node's facts.
func (n *Node) NodesWithFacts(ctx context.Context, where string) ([]api.Node, error) {
	return n.nodes(ctx, where, true)
}

func (n *Node) nodes(ctx context.Context, where string, withFacts bool) ([]api.Node, error) {
	match, err := nodeMatches(where)
	if err != nil {
		return nil, err
	}
	out := []api.Node{}
	rules := n.rules()
	self, now, reconnect := n.host.ID(), n.now(), n.settings().reconnectTimeout
	for _, e := range n.replica.Prefix(nodesPrefix) {
		if where != "" {
			// The client left: a costly filter over every record (up to
			// 1,024 of them pending, their facts any peer's) stops here,
			// as policy test does.
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		c, ok := n.recordAt(e)
		if !ok || c.bad || !match(c.rec) {
			continue
		}
		l := Alive
		if c.id != self {
			v := n.viewAt(c.id, c.idStr, e)
			if v.reaped(now, reconnect) {
				continue
			}
			l = v.state()
		}
		out = append(out, api.Node{ID: c.idStr, Name: c.rec.Name, Addrs: c.rec.Addrs, Version: c.rec.Version,
			Alive: l == Alive, Liveness: l, Self: c.id == self, Admission: string(rules.Status(c.id))})
		if withFacts {
			out[len(out)-1].Facts = c.rec.facts()
		}
	}
	slices.SortFunc(out, func(a, b api.Node) int { return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.ID, b.ID)) })
	return out, nil
}

// nodeName is the part of a node record most views need.
type nodeName struct {
	Name   string
	Addrs  []string
	Left   bool
	LeftAt time.Time
}

// nodeNamed returns one node's name and addresses, if it has a record.
func (n *Node) nodeNamed(id peer.ID) (nodeName, bool) {
	e, ok := n.replica.Get(nodesPrefix + id.String())
	if !ok {
		return nodeName{}, false
	}
	c, _ := n.recordAt(e)
	return c.name(), true
}

// name is the name part of the record.
func (c cachedRecord) name() nodeName {
	return nodeName{Name: c.rec.Name, Addrs: c.rec.Addrs, Left: c.rec.Left, LeftAt: c.rec.LeftAt}
}

// resolve turns node names or peer IDs into peer IDs of known nodes. A
// name resolves among the nodes that count (a pending node's name is only
// its claim), to the live one when several carry it.
func (n *Node) resolve(names []string) ([]peer.ID, error) {
	if len(names) == 0 {
		return nil, api.BadRequest(errors.New("name at least one node"))
	}
	rules := n.rules()
	var out []peer.ID
	for _, s := range names {
		if id, err := peer.Decode(s); err == nil {
			if _, ok := n.replica.Get(nodesPrefix + id.String()); !ok {
				return nil, api.NotFound(fmt.Errorf("%w %s: no node with that peer ID has announced itself", ErrUnknownNode, s))
			}
			out = append(out, id)
			continue
		}
		id, err := n.pick(rules, s, n.named(rules, s))
		if err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, nil
}

// tribeView is what the state says of one tribe.
type tribeView struct {
	explicit bool
	members  map[peer.ID][]string // via: "manual" and/or policy names
	policies []string
	plugins  []string
}

// tribes gathers every tribe from the state: those with metadata, members
// or (with the policy issue) policies naming them.
func (n *Node) tribes() map[string]*tribeView {
	out := map[string]*tribeView{}
	get := func(t string) *tribeView {
		if v, ok := out[t]; ok {
			return v
		}
		v := &tribeView{members: map[peer.ID][]string{}}
		out[t] = v
		return v
	}
	rules := n.rules()
	for _, e := range n.replica.Prefix(tribesPrefix) {
		segs := strings.Split(e.Key, "/")
		switch {
		case len(segs) == 2:
			get(segs[1]).explicit = true
		case len(segs) == 5 && segs[2] == "members":
			// Only memberships that count make a member (or a tribe).
			tribe, id, via, ok := splitMemberKey(e.Key)
			if !ok {
				continue
			}
			if counted := n.memberVia(rules, tribe, id, via, e); len(counted) > 0 {
				v := get(tribe)
				v.members[id] = append(v.members[id], counted...)
			}
		case len(segs) == 4 && segs[2] == "plugins":
			v := get(segs[1])
			v.plugins = append(v.plugins, segs[3])
		}
	}
	for _, p := range n.policies() {
		v := get(p.Tribe)
		v.policies = append(v.policies, p.Name)
	}
	return out
}

func (n *Node) members(v *tribeView) []api.Member {
	out := []api.Member{}
	self, now, reconnect := n.host.ID(), n.now(), n.settings().reconnectTimeout
	for id, via := range v.members {
		idStr := id.String()
		e, _ := n.replica.Get(nodesPrefix + idStr)
		var c cachedRecord
		if e != nil {
			c, _ = n.recordAt(e)
		}
		alive := true
		if id != self {
			pv := n.viewAt(id, idStr, e)
			if pv.reaped(now, reconnect) {
				continue
			}
			alive = pv.state() == Alive
		}
		slices.Sort(via)
		out = append(out, api.Member{ID: idStr, Name: c.rec.Name, Alive: alive, Via: via})
	}
	slices.SortFunc(out, func(a, b api.Member) int { return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.ID, b.ID)) })
	return out
}

// Tribes implements api.Agent.
func (n *Node) Tribes(ctx context.Context) ([]api.TribeSummary, error) {
	out := []api.TribeSummary{}
	for name, v := range n.tribes() {
		out = append(out, api.TribeSummary{Name: name, Members: len(v.members)})
	}
	slices.SortFunc(out, func(a, b api.TribeSummary) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Tribe implements api.Agent.
func (n *Node) Tribe(ctx context.Context, name string) (api.Tribe, error) {
	v, ok := n.tribes()[name]
	if !ok {
		return api.Tribe{}, api.NotFound(fmt.Errorf("%w %q (see `tribe list`)", ErrUnknownTribe, name))
	}
	slices.Sort(v.plugins)
	return api.Tribe{Name: name, Explicit: v.explicit, Members: n.members(v), Policies: orEmpty(v.policies), Plugins: orEmpty(v.plugins)}, nil
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// writeErr maps replica write errors to API errors: an authorisation
// failure is the caller's (this node is not a trusted writer).
func writeErr(err error) error {
	if errors.Is(err, gossip.ErrUnauthorized) || errors.Is(err, gossip.ErrUnknownKey) {
		return api.BadRequest(err)
	}
	return err
}

func checkTribeName(name string) error {
	if !gossip.ValidName(name) {
		return api.BadRequest(fmt.Errorf("tribe name %q: use 1 to 63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit", name))
	}
	return nil
}

// CreateTribe implements api.Agent.
func (n *Node) CreateTribe(ctx context.Context, name string) (api.Tribe, error) {
	if err := checkTribeName(name); err != nil {
		return api.Tribe{}, err
	}
	if v, ok := n.tribes()[name]; ok && v.explicit {
		return api.Tribe{}, api.BadRequest(fmt.Errorf("tribe %q exists", name))
	}
	b, _ := json.Marshal(tribeRecord{CreatedBy: n.host.ID().String()})
	if _, err := n.replica.Put(ctx, tribesPrefix+name, b); err != nil {
		return api.Tribe{}, writeErr(err)
	}
	return n.Tribe(ctx, name)
}

// DeleteTribe implements api.Agent: it deletes everything under the tribe
// that trusted writers own (its metadata, manual memberships, plugins and
// tasks), so the tribe is gone from every view. A tribe a policy names is
// refused: the policy would bring it back, so it goes first. Policy
// memberships are each member's own entries: with no policy naming the
// tribe they count for nothing, and each member drops its own.
func (n *Node) DeleteTribe(ctx context.Context, name string) (api.Tribe, error) {
	if err := checkTribeName(name); err != nil {
		return api.Tribe{}, err
	}
	v, ok := n.tribes()[name]
	owned := n.trustedEntries(name)
	if !ok && len(owned) == 0 {
		return api.Tribe{}, api.NotFound(fmt.Errorf("%w %q (see `tribe list`)", ErrUnknownTribe, name))
	}
	if ok && len(v.policies) > 0 {
		slices.Sort(v.policies)
		return api.Tribe{}, api.BadRequest(fmt.Errorf("tribe %q: policy %s names it; delete the policy first (tribe policy delete %s)",
			name, strings.Join(v.policies, ", policy "), v.policies[0]))
	}
	if err := n.replica.Trust().Authorize(tribesPrefix+name, n.host.ID()); err != nil {
		return api.Tribe{}, writeErr(err)
	}
	var gone tribeView
	if ok {
		gone = *v
	}
	// Every manual membership, counted or not: a revoked node's must not
	// come back with its re-admission, nor in a tribe made anew under the
	// same name. The same for plugins and tasks.
	for _, key := range owned {
		if err := ctx.Err(); err != nil {
			return api.Tribe{}, fmt.Errorf("node: delete tribe %s: stopped: %w", name, err)
		}
		if _, err := n.replica.Delete(ctx, key); err != nil {
			return api.Tribe{}, writeErr(err)
		}
	}
	slices.Sort(gone.plugins)
	return api.Tribe{Name: name, Explicit: gone.explicit, Members: n.members(&gone), Policies: []string{}, Plugins: orEmpty(gone.plugins)}, nil
}

// trustedEntries lists the live keys of tribe that trusted writers own:
// its metadata, manual memberships, plugins and tasks.
func (n *Node) trustedEntries(tribe string) []string {
	var out []string
	if _, ok := n.replica.Get(tribesPrefix + tribe); ok {
		out = append(out, tribesPrefix+tribe)
	}
	for _, e := range n.replica.Prefix(tribesPrefix + tribe + "/") {
		if k, err := gossip.Classify(e.Key); err == nil && k.Writer == gossip.Trusted {
			out = append(out, e.Key)
		}
	}
	return out
}

func memberKey(tribe string, id peer.ID, via string) string {
	return tribesPrefix + tribe + "/members/" + id.String() + "/" + via
}

// maxNodesPerRequest bounds the distinct nodes one join or leave names:
// each is a signed entry, stored, fsynced and published.
const maxNodesPerRequest = 1024

// distinctNames drops repeated names from a request, keeping the first of
// each, and refuses more than maxNodesPerRequest distinct ones.
func distinctNames(names []string) ([]string, error) {
	names = distinct(names)
	if len(names) > maxNodesPerRequest {
		return nil, api.BadRequest(fmt.Errorf("%d nodes named: at most %d in one request; split it", len(names), maxNodesPerRequest))
	}
	return names, nil
}

// distinct returns s without repeats, in the order of their first
// appearance.
func distinct[T comparable](s []T) []T {
	seen := make(map[T]bool, len(s))
	var out []T
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// distinctNodes resolves names to the distinct peer IDs they name (a node
// named twice, or by name and by peer ID, is written once), refusing more
// than maxNodesPerRequest distinct names.
func (n *Node) distinctNodes(names []string) ([]peer.ID, error) {
	names, err := distinctNames(names)
	if err != nil {
		return nil, err
	}
	ids, err := n.resolve(names)
	if err != nil {
		return nil, err
	}
	return distinct(ids), nil
}

// Join implements api.Agent: manual membership of existing nodes in a
// tribe that was created or that a policy names; one that only members or
// plugins left behind must be created first. It stops writing when ctx
// ends (the client left).
func (n *Node) Join(ctx context.Context, tribe string, nodes []string) ([]api.Member, error) {
	if v, ok := n.tribes()[tribe]; !ok || (!v.explicit && len(v.policies) == 0) {
		return nil, api.NotFound(fmt.Errorf("%w %q (create it with `tribe create %s`)", ErrUnknownTribe, tribe, tribe))
	}
	ids, err := n.distinctNodes(nodes)
	if err != nil {
		return nil, err
	}
	rules := n.rules()
	for _, id := range ids {
		if !rules.Counts(id) {
			return nil, api.BadRequest(fmt.Errorf("node %s is %s: admit it first (tribe admit %s)", id, rules.Status(id), id))
		}
	}
	b, _ := json.Marshal(memberRecord{})
	for i, id := range ids {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("node: join %s: stopped after %d of %d nodes: %w", tribe, i, len(ids), err)
		}
		if _, err := n.replica.Put(ctx, memberKey(tribe, id, "manual"), b); err != nil {
			return nil, writeErr(err)
		}
	}
	return n.members(n.tribes()[tribe]), nil
}

// Leave implements api.Agent: it removes manual membership. It stops
// writing when ctx ends (the client left).
func (n *Node) Leave(ctx context.Context, tribe string, nodes []string) ([]api.Member, error) {
	v, ok := n.tribes()[tribe]
	if !ok {
		return nil, api.NotFound(fmt.Errorf("%w %q", ErrUnknownTribe, tribe))
	}
	ids, err := n.distinctNodes(nodes)
	if err != nil {
		return nil, err
	}
	// The entry, not the view: a revoked node's manual membership counts
	// for nothing but can still be removed.
	for _, id := range ids {
		if _, ok := n.replica.Get(memberKey(tribe, id, "manual")); !ok {
			return nil, api.BadRequest(fmt.Errorf("node %s is not a manual member of %q", id, tribe))
		}
	}
	for i, id := range ids {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("node: leave %s: stopped after %d of %d nodes: %w", tribe, i, len(ids), err)
		}
		if _, err := n.replica.Delete(ctx, memberKey(tribe, id, "manual")); err != nil {
			return nil, writeErr(err)
		}
	}
	if v, ok = n.tribes()[tribe]; !ok {
		return []api.Member{}, nil
	}
	return n.members(v), nil
}
