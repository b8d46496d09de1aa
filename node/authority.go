package node

import (
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/gossip/authority"
	"github.com/tribeagent/tribe/policy"
)

// The trust model over the state (package authority has the rules): whose
// entries count and which memberships count. Everything that reads
// memberships goes through here, so a pending node or a membership no
// policy backs is invisible everywhere: tribe views, call targets, call
// authorisation, and the plugins this node loads. names.go binds names,
// admission.go writes admissions.

// authState caches what the rules need from the state, kept current by
// watchers that are registered before any other (New), so every later
// watcher of the same change sees it applied.
type authState struct {
	trusted atomic.Pointer[map[peer.ID]bool] // replaced whole by tribe reload

	admMu    sync.RWMutex
	admitted map[peer.ID]authority.Admission // by admitted/<peer>, updated one key at a time

	mu        sync.Mutex
	policyGen uint64                         // bumped on every policy change
	refs      map[string]authority.PolicyRef // the policies as of refsGen
	refsGen   uint64                         // the policyGen refs were read at
	backed    map[string]backing             // by member key
	nameOf    map[peer.ID]string             // each record's name (names.go)
	byName    map[string][]peer.ID           // records by name
	admName   map[string][]peer.ID           // admitted nodes by the name they were admitted under

	unbacked  atomic.Int64 // policy memberships that counted for nothing when they arrived
	nameTaken atomic.Int64 // records that claimed a name another node that counts holds
	// autoAdmitEvals counts the records --auto-admit evaluated.
	autoAdmitEvals atomic.Int64
}

// backing is one policy membership's backing policies and what it was
// computed from.
type backing struct {
	member, record *gossip.Signed
	policyGen      uint64
	policies       []string
}

// initAuthority loads what the rules need and starts keeping it current.
// It runs in New, before the node talks to anyone and before any other
// watcher is registered.
func (n *Node) initAuthority() {
	a := &n.auth
	a.setTrusted(n.replica.Trust())
	a.admitted = map[peer.ID]authority.Admission{}
	a.backed = map[string]backing{}
	a.nameOf, a.byName, a.admName = map[peer.ID]string{}, map[string][]peer.ID{}, map[string][]peer.ID{}
	self := authority.AdmittedPrefix + n.host.ID().String()
	n.replica.Watch(authority.AdmittedPrefix, func(c gossip.Change) {
		n.applyAdmission(c.Key, c.New)
		n.replica.ForgetRefusals() // what the node refused may count now
		if id, err := peer.Decode(strings.TrimPrefix(c.Key, authority.AdmittedPrefix)); err == nil && n.remembered != nil {
			n.rememberAdmitted(id)
		}
		if c.Key == self && n.rules().Counts(n.host.ID()) {
			n.announceOwn()
		}
	})
	n.replica.Watch(policiesPrefix, func(gossip.Change) {
		a.mu.Lock()
		a.policyGen++
		clear(a.backed)
		a.mu.Unlock()
	})
	n.replica.Watch(nodesPrefix, n.checkArrivingRecord)
	n.replica.Watch(tribesPrefix, n.checkArrivingMembership)
	for _, e := range n.replica.Prefix(authority.AdmittedPrefix) {
		n.applyAdmission(e.Key, e)
	}
	for _, e := range n.replica.Prefix(nodesPrefix) {
		n.checkArrivingRecord(gossip.Change{Key: e.Key, New: e})
	}
}

// announceOwn has this node's policy memberships written again, once it
// is admitted: other nodes refused them while it was pending. A new
// version each, as pubsub would drop the very message it carried before
// (its peers saw it, and refused it, in the last minutes); by the
// reconcile loop, so that a membership the loop changes meanwhile is not
// written back as it was.
func (n *Node) announceOwn() {
	n.rewriteOwn.Store(true)
	n.triggerReconcile()
	n.pokeRecord() // and its record, with the facts it withheld if they were too large
}

// applyAdmission takes one admitted/<peer> entry (nil or a tombstone: no
// admission). A malformed one (a trusted writer's bug) admits nobody.
func (n *Node) applyAdmission(key string, e *gossip.Signed) {
	id, err := peer.Decode(strings.TrimPrefix(key, authority.AdmittedPrefix))
	if err != nil {
		return
	}
	var adm authority.Admission
	ok := e != nil && !e.Deleted
	if ok {
		adm, err = authority.DecodeAdmission(e.Value)
		ok = err == nil
	}
	a := &n.auth
	a.admMu.Lock()
	old, had := a.admitted[id]
	if ok {
		a.admitted[id] = adm
	} else {
		delete(a.admitted, id)
	}
	a.admMu.Unlock()
	a.mu.Lock()
	if had && old.State == authority.Admitted {
		unindex(a.admName, old.Name, id)
	}
	if ok && adm.State == authority.Admitted && adm.Name != "" {
		a.admName[adm.Name] = append(a.admName[adm.Name], id)
	}
	a.mu.Unlock()
}

// admission looks id up in the admissions (authority.Rules' look-up).
func (a *authState) admission(id peer.ID) (authority.Status, bool) {
	a.admMu.RLock()
	defer a.admMu.RUnlock()
	adm, ok := a.admitted[id]
	return adm.State, ok
}

// admittedName is the name id was admitted under, if it is admitted.
func (a *authState) admittedName(id peer.ID) (string, bool) {
	a.admMu.RLock()
	defer a.admMu.RUnlock()
	adm, ok := a.admitted[id]
	return adm.Name, ok && adm.State == authority.Admitted
}

// setTrusted takes the trust list the rules judge by.
func (a *authState) setTrusted(t gossip.Trust) {
	m := map[peer.ID]bool{}
	for _, p := range t.Peers() {
		m[p] = true
	}
	a.trusted.Store(&m)
}

// rules are the trust list and the admissions as of now.
func (n *Node) rules() authority.Rules {
	return authority.NewRules(*n.auth.trusted.Load(), n.auth.admission)
}

// policyRefs are the policies in the state by name, read once per policy
// change. The map must not be changed.
func (n *Node) policyRefs() (map[string]authority.PolicyRef, uint64) {
	a := &n.auth
	a.mu.Lock()
	if a.refs != nil && a.refsGen == a.policyGen {
		defer a.mu.Unlock()
		return a.refs, a.refsGen
	}
	gen := a.policyGen
	a.mu.Unlock()
	refs := map[string]authority.PolicyRef{}
	for _, p := range n.policies() {
		refs[p.Name] = authority.PolicyRef{Tribe: p.Tribe, Expr: p.Expr}
	}
	a.mu.Lock()
	if a.policyGen == gen {
		a.refs, a.refsGen = refs, gen
	}
	a.mu.Unlock()
	return refs, gen
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
// from the cache when nothing it depends on changed. Each policy the claim
// names is evaluated at most once, however often the claim repeats it.
func (n *Node) policyBacking(tribe string, id peer.ID, e *gossip.Signed) []string {
	rec, _ := n.replica.Get(nodesPrefix + id.String())
	refs, gen := n.policyRefs()
	a := &n.auth
	a.mu.Lock()
	if b, ok := a.backed[e.Key]; ok && b.member == e && b.record == rec && b.policyGen == gen {
		a.mu.Unlock()
		return b.policies
	}
	a.mu.Unlock()

	var claimed memberRecord
	json.Unmarshal(e.Value, &claimed)
	// The record's facts are decoded only once a policy is to be run on
	// them: a node that counts holds up to gossip.MaxPolicyMemberships
	// claims and rewrites them as it likes, and decoding its record (up
	// to 64 KiB, 1 ms) for each, in tribes no policy names, cost every
	// node more than the claims' evaluation.
	var facts policy.Facts
	decoded := false
	backed := authority.Backing(tribe, claimed.Policies, refs, func(expr string) bool {
		if !decoded {
			decoded = true
			var r nodeRecord
			if rec != nil && json.Unmarshal(rec.Value, &r) == nil {
				facts = r.facts()
			}
		}
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
// later, in any order) but counts for nothing until it is backed. A node
// that does not count gets no evaluation of its claim at all, only a look
// at whether the policies it names exist: its claim cannot cost CPU.
func (n *Node) checkArrivingMembership(c gossip.Change) {
	tribe, id, via, ok := splitMemberKey(c.Key)
	if !ok || via != "policy" {
		return
	}
	if c.New == nil || c.New.Deleted {
		n.auth.mu.Lock()
		delete(n.auth.backed, c.Key)
		n.auth.mu.Unlock()
		return
	}
	var unbacked bool
	if n.rules().Counts(id) {
		unbacked = len(n.policyBacking(tribe, id, c.New)) == 0
	} else {
		var claimed memberRecord
		json.Unmarshal(c.New.Value, &claimed)
		refs, _ := n.policyRefs()
		unbacked = len(authority.Candidates(tribe, claimed.Policies, refs)) == 0
	}
	if unbacked {
		n.auth.unbacked.Add(1)
		n.authWarn.warn(n.log, id.String(), "a policy membership no policy backs counts for nothing (it counts once a policy for the tribe matches the node's facts)",
			"tribe", tribe, "node", id)
	}
}
