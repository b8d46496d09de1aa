package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/gossip/authority"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/policy"
)

// The trust model over the state (package authority has the rules): whose
// entries count, which memberships count, and admission. Everything that
// reads memberships or names goes through here, so a pending node or a
// membership no policy backs is invisible everywhere: tribe views, call
// targets, call authorisation, and the plugins this node loads.

// authState caches what the rules need from the state. Admissions are
// kept current by a watcher; a membership's backing is cached by the
// entries it was computed from.
type authState struct {
	mu         sync.Mutex
	trusted    map[peer.ID]bool
	admissions map[peer.ID]authority.Status // replaced, never changed, on update
	policyGen  uint64                       // bumped on every policy change
	backed     map[string]backing           // by member key
	// The name each node's record carries, and the nodes by name, kept by
	// the record watcher: a record's arrival must not cost a pass over
	// every record (a fleet's start would be quadratic).
	nameOf map[peer.ID]string
	byName map[string][]peer.ID

	unbacked  atomic.Int64 // policy memberships that counted for nothing when they arrived
	nameTaken atomic.Int64 // records that claimed a name a live node that counts holds
}

// backing is one policy membership's backing policies and what it was
// computed from.
type backing struct {
	member, record *gossip.Signed
	policyGen      uint64
	policies       []string
}

// initAuthority loads the admissions and starts keeping them current. It
// runs in New, before the node talks to anyone.
func (n *Node) initAuthority() {
	a := &n.auth
	a.trusted = map[peer.ID]bool{}
	for _, p := range n.replica.Trust().Peers() {
		a.trusted[p] = true
	}
	a.backed = map[string]backing{}
	a.nameOf, a.byName = map[peer.ID]string{}, map[string][]peer.ID{}
	for id, rec := range n.allNames() {
		a.setName(id, rec.Name)
	}
	n.replica.Watch(authority.AdmittedPrefix, func(gossip.Change) { n.loadAdmissions() })
	n.replica.Watch(policiesPrefix, func(gossip.Change) {
		a.mu.Lock()
		a.policyGen++
		clear(a.backed)
		a.mu.Unlock()
	})
	n.replica.Watch(tribesPrefix, n.checkArrivingMembership)
	n.replica.Watch(nodesPrefix, n.checkArrivingRecord)
	n.loadAdmissions()
}

// loadAdmissions reads every admitted/<peer> entry again. A malformed one
// (a trusted writer's bug) admits nobody.
func (n *Node) loadAdmissions() {
	out := map[peer.ID]authority.Status{}
	for _, e := range n.replica.Prefix(authority.AdmittedPrefix) {
		id, err := peer.Decode(strings.TrimPrefix(e.Key, authority.AdmittedPrefix))
		if err != nil {
			continue
		}
		if a, err := authority.DecodeAdmission(e.Value); err == nil {
			out[id] = a.State
		}
	}
	n.auth.mu.Lock()
	n.auth.admissions = out
	n.auth.mu.Unlock()
}

// rules are the trust list and the admissions as of now.
func (n *Node) rules() authority.Rules {
	n.auth.mu.Lock()
	defer n.auth.mu.Unlock()
	return authority.NewRules(n.auth.trusted, n.auth.admissions)
}

// policyRefs are the policies in the state, by name.
func (n *Node) policyRefs() map[string]authority.PolicyRef {
	out := map[string]authority.PolicyRef{}
	for _, p := range n.policies() {
		out[p.Name] = authority.PolicyRef{Tribe: p.Tribe, Expr: p.Expr}
	}
	return out
}

// memberVia says how id's membership entry e of tribe counts: "manual",
// or the policies that back it; nil if it counts for nothing (its node is
// not admitted, or no existing policy for tribe matches its facts).
func (n *Node) memberVia(rules authority.Rules, tribe string, id peer.ID, via string, e *gossip.Signed) []string {
	if !rules.Counts(id) {
		return nil
	}
	if via == "manual" {
		return []string{"manual"}
	}
	return n.policyBacking(tribe, id, e)
}

// policyBacking returns the policies that back a policy membership entry,
// from the cache when nothing it depends on changed.
func (n *Node) policyBacking(tribe string, id peer.ID, e *gossip.Signed) []string {
	rec, _ := n.replica.Get(nodesPrefix + id.String())
	a := &n.auth
	a.mu.Lock()
	gen := a.policyGen
	if b, ok := a.backed[e.Key]; ok && b.member == e && b.record == rec && b.policyGen == gen {
		a.mu.Unlock()
		return b.policies
	}
	a.mu.Unlock()

	var claimed memberRecord
	json.Unmarshal(e.Value, &claimed)
	var facts policy.Facts
	if rec != nil {
		var r nodeRecord
		if json.Unmarshal(rec.Value, &r) == nil {
			facts = r.facts()
		}
	}
	backed := authority.Backing(tribe, claimed.Policies, n.policyRefs(), func(expr string) bool {
		if facts == nil {
			return false // no record: nothing to check the claim against
		}
		prg, err := policy.Compile(expr)
		if err != nil {
			return false
		}
		ok, _ := prg.Eval(facts)
		return ok
	})

	a.mu.Lock()
	if a.policyGen == gen {
		a.backed[e.Key] = backing{member: e, record: rec, policyGen: gen, policies: backed}
	}
	a.mu.Unlock()
	return backed
}

// splitMemberKey parses tribes/<t>/members/<peer>/<via>.
func splitMemberKey(key string) (tribe string, id peer.ID, via string, ok bool) {
	segs := strings.Split(key, "/")
	if len(segs) != 5 || segs[0]+"/" != tribesPrefix || segs[2] != "members" {
		return "", "", "", false
	}
	id, err := peer.Decode(segs[3])
	if err != nil {
		return "", "", "", false
	}
	return segs[1], id, segs[4], true
}

// checkArrivingMembership counts a policy membership that no policy backs
// as it arrives. It is kept (the policy or the record it needs may arrive
// later, in any order) but counts for nothing until it is backed.
func (n *Node) checkArrivingMembership(c gossip.Change) {
	if c.New == nil || c.New.Deleted {
		return
	}
	tribe, id, via, ok := splitMemberKey(c.Key)
	if !ok || via != "policy" {
		return
	}
	if len(n.policyBacking(tribe, id, c.New)) == 0 {
		n.auth.unbacked.Add(1)
		n.authWarn.warn(n.log, id.String(), "a policy membership no policy backs counts for nothing (it counts once a policy for the tribe matches the node's facts)",
			"tribe", tribe, "node", id)
	}
}

// setName indexes id under name ("" removes it). Callers hold a.mu, or
// own a before it is shared.
func (a *authState) setName(id peer.ID, name string) {
	if old, ok := a.nameOf[id]; ok {
		if old == name {
			return
		}
		a.byName[old] = slices.DeleteFunc(a.byName[old], func(p peer.ID) bool { return p == id })
		if len(a.byName[old]) == 0 {
			delete(a.byName, old)
		}
		delete(a.nameOf, id)
	}
	if name != "" {
		a.nameOf[id] = name
		a.byName[name] = append(a.byName[name], id)
	}
}

// checkArrivingRecord indexes a record's name, and counts a record that
// claims a name a live node that counts already holds; the name table
// ignores the claim while the holder lives (see pick).
func (n *Node) checkArrivingRecord(c gossip.Change) {
	id, err := peer.Decode(strings.TrimPrefix(c.Key, nodesPrefix))
	if err != nil {
		return
	}
	var rec nodeName
	if c.New != nil && !c.New.Deleted {
		json.Unmarshal(c.New.Value, &rec)
	}
	n.auth.mu.Lock()
	n.auth.setName(id, rec.Name)
	n.auth.mu.Unlock()
	if rec.Name == "" {
		return
	}
	if holder, ok := n.nameHolder(rec.Name, id); ok {
		n.auth.nameTaken.Add(1)
		n.authWarn.warn(n.log, id.String(), "a node claims a name a live node holds; the claim is ignored",
			"name", rec.Name, "claimant", id, "holder", holder)
	}
}

// nameHolder returns a live node other than except that counts and has
// name.
func (n *Node) nameHolder(name string, except peer.ID) (peer.ID, bool) {
	rules := n.rules()
	for _, id := range n.named(rules, name) {
		if id != except && n.liveness(id) == Alive {
			return id, true
		}
	}
	return "", false
}

// named returns the nodes that count and carry name.
func (n *Node) named(rules authority.Rules, name string) []peer.ID {
	n.auth.mu.Lock()
	defer n.auth.mu.Unlock()
	var out []peer.ID
	for _, id := range n.auth.byName[name] {
		if rules.Counts(id) {
			out = append(out, id)
		}
	}
	return out
}

// allNames is every node's name and addresses, counted or not.
func (n *Node) allNames() map[peer.ID]nodeName {
	out := map[peer.ID]nodeName{}
	for _, e := range n.replica.Prefix(nodesPrefix) {
		id, err := peer.Decode(strings.TrimPrefix(e.Key, nodesPrefix))
		var rec nodeName
		if err != nil || json.Unmarshal(e.Value, &rec) != nil {
			continue
		}
		out[id] = rec
	}
	return out
}

// pick chooses among the nodes that carry one name: the only one, or the
// only live one; otherwise it is ambiguous.
func (n *Node) pick(name string, ids []peer.ID) (peer.ID, error) {
	switch len(ids) {
	case 0:
		return "", api.NotFound(fmt.Errorf("%w %q (see `tribe nodes`)", ErrUnknownNode, name))
	case 1:
		return ids[0], nil
	}
	var alive []peer.ID
	for _, id := range ids {
		if n.liveness(id) == Alive {
			alive = append(alive, id)
		}
	}
	if len(alive) == 1 {
		return alive[0], nil
	}
	slices.Sort(ids)
	return "", api.BadRequest(fmt.Errorf("node name %q is ambiguous: %d nodes have it (%s); use a peer ID", name, len(ids), strings.Join(idStrings(ids), ", ")))
}

func idStrings(ids []peer.ID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

// Admission.

// ErrOpenTrust is returned for admission commands on an agent with no
// trusted writers.
var ErrOpenTrust = errors.New("trust is open (the agent has no --trusted writers): every node counts, there is nothing to admit")

// Admit implements api.Agent: it admits the named nodes, or with
// allPending every pending node whose name no live node that counts holds.
func (n *Node) Admit(ctx context.Context, nodes []string, allPending bool) ([]api.Admission, error) {
	rules := n.rules()
	if rules.Open() {
		return nil, api.BadRequest(ErrOpenTrust)
	}
	if len(nodes) > 0 && allPending {
		return nil, api.BadRequest(errors.New("name nodes or --all-pending, not both"))
	}
	if err := n.replica.Trust().Authorize(authority.AdmittedPrefix+n.host.ID().String(), n.host.ID()); err != nil {
		return nil, writeErr(err)
	}
	names := n.allNames()
	var ids []peer.ID
	if allPending {
		for _, id := range slices.Sorted(maps.Keys(names)) {
			if rules.Status(id) == authority.Pending {
				ids = append(ids, id)
			}
		}
	} else {
		var err error
		if ids, err = n.resolveAny(nodes, names); err != nil {
			return nil, err
		}
	}
	out := []api.Admission{}
	for _, id := range ids {
		res := api.Admission{ID: id.String(), Name: names[id].Name, Admission: string(rules.Status(id))}
		switch rules.Status(id) {
		case authority.Trusted:
			res.Error = "a trusted writer counts without admission"
		case authority.Admitted:
		default:
			if holder, taken := n.nameHolder(names[id].Name, id); taken {
				res.Error = fmt.Sprintf("name %q is held by live node %s: start this node with another --name, or revoke the holder first", names[id].Name, holder)
				if !allPending {
					return nil, api.BadRequest(errors.New(res.Error))
				}
				break
			}
			if err := n.writeAdmission(ctx, id, authority.Admission{State: authority.Admitted, Name: names[id].Name}); err != nil {
				return nil, err
			}
			res.Admission = string(authority.Admitted)
		}
		out = append(out, res)
	}
	return out, nil
}

// Revoke implements api.Agent: the nodes' entries stop counting, and an
// automatic admission does not bring them back (tribe admit does).
func (n *Node) Revoke(ctx context.Context, nodes []string) ([]api.Admission, error) {
	rules := n.rules()
	if rules.Open() {
		return nil, api.BadRequest(ErrOpenTrust)
	}
	names := n.allNames()
	ids, err := n.resolveAny(nodes, names)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if rules.Status(id) == authority.Trusted {
			return nil, api.BadRequest(fmt.Errorf("node %s is a trusted writer: remove it from --trusted on every agent instead", id))
		}
	}
	out := []api.Admission{}
	for _, id := range ids {
		if err := n.writeAdmission(ctx, id, authority.Admission{State: authority.Revoked, Name: names[id].Name}); err != nil {
			return nil, err
		}
		out = append(out, api.Admission{ID: id.String(), Name: names[id].Name, Admission: string(authority.Revoked)})
	}
	return out, nil
}

// writeAdmission writes one admission entry, unless ctx has ended (the
// client of a long admit or revoke left): nothing more is written then.
func (n *Node) writeAdmission(ctx context.Context, id peer.ID, a authority.Admission) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("node: admission (%s) of %s not written: %w", a.State, id, err)
	}
	b, _ := json.Marshal(a)
	if _, err := n.replica.Put(ctx, authority.AdmittedPrefix+id.String(), b); err != nil {
		return writeErr(err)
	}
	return nil
}

// resolveAny resolves names or peer IDs among every node with a record,
// counted or not: admission is how a node comes to count. Like join, it
// takes at most maxNodesPerRequest distinct names and gives each node once.
func (n *Node) resolveAny(nodes []string, names map[peer.ID]nodeName) ([]peer.ID, error) {
	if len(nodes) == 0 {
		return nil, api.BadRequest(errors.New("name at least one node"))
	}
	nodes, err := distinctNames(nodes)
	if err != nil {
		return nil, err
	}
	byName := map[string][]peer.ID{}
	for id, rec := range names {
		byName[rec.Name] = append(byName[rec.Name], id)
	}
	var out []peer.ID
	for _, s := range nodes {
		if id, err := peer.Decode(s); err == nil {
			if _, ok := names[id]; !ok {
				return nil, api.NotFound(fmt.Errorf("%w %s: no node with that peer ID has announced itself", ErrUnknownNode, s))
			}
			out = append(out, id)
			continue
		}
		ids := byName[s]
		if len(ids) > 1 {
			slices.Sort(ids)
			return nil, api.BadRequest(fmt.Errorf("node name %q is ambiguous: %d nodes have it (%s); use a peer ID", s, len(ids), strings.Join(idStrings(ids), ", ")))
		}
		id, err := n.pick(s, ids)
		if err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return distinct(out), nil
}

// autoAdmitLoop admits, as a trusted writer, every pending node whose
// replicated facts match Config.AutoAdmit and whose name no live node
// holds. Revoked nodes stay revoked.
func (n *Node) autoAdmitLoop() {
	prg, err := policy.Compile(n.cfg.AutoAdmit)
	if err != nil { // Validate compiled it
		n.log.Error("auto-admit expression", "err", err)
		return
	}
	trigger := make(chan struct{}, 1)
	poke := func(gossip.Change) {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	defer n.replica.Watch(nodesPrefix, poke)()
	defer n.replica.Watch(authority.AdmittedPrefix, poke)()
	poke(gossip.Change{})
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-trigger:
		}
		rules := n.rules()
		for id, rec := range n.nodeRecords() {
			if rules.Status(id) != authority.Pending {
				continue
			}
			if ok, _ := prg.Eval(rec.facts()); !ok {
				continue
			}
			if holder, taken := n.nameHolder(rec.Name, id); taken {
				n.log.Debug("not admitting a node that claims a live node's name", "node", id, "name", rec.Name, "holder", holder)
				continue
			}
			if err := n.writeAdmission(n.ctx, id, authority.Admission{State: authority.Admitted, Name: rec.Name}); err != nil {
				if n.ctx.Err() == nil {
					n.log.Warn("auto-admit", "node", id, "err", err)
				}
				continue
			}
			n.log.Info("admitted by --auto-admit", "node", id, "name", rec.Name)
		}
	}
}

// pendingCount is how many nodes with a record wait for admission.
func (n *Node) pendingCount() int {
	rules := n.rules()
	c := 0
	for _, e := range n.replica.Prefix(nodesPrefix) {
		if id, err := peer.Decode(strings.TrimPrefix(e.Key, nodesPrefix)); err == nil && rules.Status(id) == authority.Pending {
			c++
		}
	}
	return c
}
