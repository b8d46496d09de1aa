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
	"time"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/internal/backoff"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/policy"
)

const policiesPrefix = "policies/"

// ErrUnknownPolicy is returned for a policy name that does not exist.
var ErrUnknownPolicy = errors.New("unknown policy")

// ErrFactsRefused is returned for a new set of facts that cannot be taken
// whole: the facts file cannot be read or parsed, or the node's record
// with them would be over the size limit.
var ErrFactsRefused = errors.New("node: facts refused")

// factsState is the node's current facts. They are replaced whole, never
// changed in place.
type factsState struct {
	mu      sync.Mutex
	facts   policy.Facts
	refused atomic.Int64 // new facts refused (facts_refused in status)
}

func (f *factsState) get() policy.Facts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.facts
}

func (f *factsState) set(facts policy.Facts) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.facts = facts
}

// gatherFacts collects the built-in facts and overlays the user's: the
// facts file, then --fact flags.
func (n *Node) gatherFacts(ctx context.Context, set *live) (policy.Facts, error) {
	builtin, err := n.collectFacts(ctx)
	if err != nil {
		n.log.Warn("some built-in facts could not be read", "err", err)
	}
	user := policy.Facts{}
	if set.factsFile != "" {
		fileFacts, err := policy.LoadFactsFile(set.factsFile)
		if err != nil {
			return nil, err
		}
		user = policy.Merge(user, fileFacts)
	}
	user = policy.Merge(user, set.facts)
	return policy.Merge(builtin, user), nil
}

// RefreshFacts collects the facts again (the agent does it every
// FactsInterval and on SIGHUP) and takes them all or nothing. Facts that
// cannot be read (the facts file unreadable or invalid) or that would make
// the node's record too large are refused whole, with ErrFactsRefused, and
// counted: the node keeps its current facts in its record, its policy
// memberships and its facts plugin. Facts taken that changed update the
// record, then the policies are evaluated again.
func (n *Node) RefreshFacts(ctx context.Context) error {
	n.reloadMu.Lock() // a reload in between would be undone by stale facts
	defer n.reloadMu.Unlock()
	facts, err := n.gatherFacts(ctx, n.settings())
	changed := false
	if err != nil {
		err = refused(err)
	} else {
		changed, err = n.adoptFacts(ctx, facts)
	}
	if errors.Is(err, ErrFactsRefused) {
		n.facts.refused.Add(1)
		return fmt.Errorf("%w (the node keeps its current facts)", err)
	}
	if err != nil {
		return err
	}
	if changed {
		n.log.Info("facts changed")
		n.triggerReconcile()
	}
	return nil
}

// refused says why a set of facts is refused.
func refused(err error) error {
	return fmt.Errorf("%w: %w", ErrFactsRefused, err)
}

func (n *Node) factsLoop() {
	for n.sleep(n.cfg.FactsInterval) {
		if err := n.RefreshFacts(n.ctx); err != nil && n.ctx.Err() == nil {
			n.log.Warn("refreshing facts", "err", err)
		}
	}
}

// policies reads every policy from the state, compiled; those that do not
// compile here are returned with their error (they never match).
func (n *Node) policies() []policy.Policy {
	var out []policy.Policy
	for _, e := range n.replica.Prefix(policiesPrefix) {
		p, read, err := readPolicy(e)
		if err != nil {
			n.policyUnusable(e, err)
		}
		if read { // one that does not compile here is kept: Evaluate reports its error
			out = append(out, p)
		}
	}
	return out
}

// readPolicy is policy entry e, with its program attached (policy.Compile
// shares compiled programs across the process); read says whether the
// entry decoded, err why this node cannot use it.
func readPolicy(e *gossip.Signed) (p policy.Policy, read bool, err error) {
	if err := json.Unmarshal(e.Value, &p); err != nil {
		return p, false, fmt.Errorf("unreadable entry: %w", err)
	}
	p.Name = strings.TrimPrefix(e.Key, policiesPrefix)
	cp, err := p.WithProgram()
	if err != nil {
		return p, true, err
	}
	return cp, true, nil
}

// policyUnusable counts, once per entry, a policy entry this node cannot
// use (it does not read, or its expression does not compile here: a
// trusted writer of another version, or a mistake): it matches nothing,
// and policy list says why.
func (n *Node) policyUnusable(e *gossip.Signed, err error) {
	u := &n.unusable
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.seen == nil || len(u.seen) >= 1024 {
		u.seen = map[*gossip.Signed]bool{}
	}
	if !u.seen[e] {
		u.seen[e] = true
		u.count.Add(1)
		n.log.Warn("a policy this node cannot use matches nothing here", "policy", strings.TrimPrefix(e.Key, policiesPrefix), "err", err)
	}
}

// unusablePolicies are the policy entries counted by policyUnusable.
type unusablePolicies struct {
	mu    sync.Mutex
	seen  map[*gossip.Signed]bool
	count atomic.Int64
}

func (n *Node) triggerReconcile() {
	select {
	case n.reconcileCh <- struct{}{}:
	default: // one is pending already
	}
}

// reconcileLoop keeps this node's policy memberships equal to what the
// policies say of its facts: on start, on every policy change, on every
// facts change, on every change to one of its own memberships, and after
// a failure (a write the store refused) again by itself, from a second
// doubling to a minute. Its own memberships: an entry this node signed
// once, replayed by whoever kept it after its tombstone was collected
// (gossip.Kind.Collected), would otherwise say it is back in a tribe it
// left; the reconcile deletes it again.
func (n *Node) reconcileLoop() {
	cancel := n.replica.Watch(policiesPrefix, func(gossip.Change) { n.triggerReconcile() })
	defer cancel()
	own := "/members/" + n.host.ID().String() + "/policy"
	cancelOwn := n.replica.Watch(tribesPrefix, func(c gossip.Change) {
		if strings.HasSuffix(c.Key, own) {
			n.triggerReconcile()
		}
	})
	defer cancelOwn()
	n.triggerReconcile()
	backoff.Loop(n.ctx, n.reconcileCh, time.Second, time.Minute, n.float,
		func() error { return n.reconcile(n.ctx) },
		func(err error, wait time.Duration) {
			n.log.Warn("updating policy memberships; trying again", "err", err, "in", wait.Round(time.Millisecond))
		})
}

// reconcile writes this node's tribes/<t>/members/<self>/policy entries:
// join where a policy matches, leave where none does any more.
func (n *Node) reconcile(ctx context.Context) error {
	rewrite := n.rewriteOwn.Swap(false)
	desired := policy.Desired(n.facts.get(), n.policies())
	self := n.host.ID().String()
	current := map[string][]string{}
	for _, e := range n.replica.Prefix(tribesPrefix) {
		segs := strings.Split(e.Key, "/")
		if len(segs) == 5 && segs[2] == "members" && segs[3] == self && segs[4] == "policy" {
			var rec memberRecord
			json.Unmarshal(e.Value, &rec)
			current[segs[1]] = rec.Policies
		}
	}
	var errs []error
	rewriteAgain := false
	for _, tribe := range slices.Sorted(maps.Keys(desired)) {
		names := desired[tribe]
		names = names[:min(len(names), maxClaimedPolicies)] // one that backs it is enough
		cur, held := current[tribe]
		same := held && slices.Equal(cur, names)
		if same && !rewrite {
			continue
		}
		b, _ := json.Marshal(memberRecord{Policies: names})
		if _, err := n.replica.Put(ctx, memberKey(tribe, n.host.ID(), "policy"), b); err != nil {
			errs = append(errs, err)
			// Only a membership held as it should be needs the rewrite
			// kept for the next try: any other is written then anyway.
			// Kept whatever failed, a write that never succeeds (a
			// tribe past gossip.MaxPolicyMemberships) had every try
			// write all the others again, and each write of its own
			// membership ran the next try at once (reconcileLoop).
			rewriteAgain = rewriteAgain || same
			continue
		}
		n.log.Info("joined tribe by policy", "tribe", tribe, "policies", names)
	}
	for tribe := range current {
		if _, ok := desired[tribe]; ok {
			continue
		}
		if _, err := n.replica.Delete(ctx, memberKey(tribe, n.host.ID(), "policy")); err != nil {
			errs = append(errs, err)
			continue
		}
		n.log.Info("left tribe: no policy matches any more", "tribe", tribe)
	}
	if rewriteAgain {
		n.rewriteOwn.Store(true) // for the next try
	}
	return errors.Join(errs...)
}

// CreatePolicy implements api.Agent: the expression is compiled and
// type-checked here, and nothing is written if it is refused.
func (n *Node) CreatePolicy(ctx context.Context, name, tribe, expr string) (api.Policy, error) {
	if !gossip.ValidName(name) {
		return api.Policy{}, api.BadRequest(fmt.Errorf("policy name %q: use 1 to 63 lower-case letters, digits, '.', '_' or '-'", name))
	}
	if err := checkTribeName(tribe); err != nil {
		return api.Policy{}, err
	}
	if _, err := policy.Compile(expr); err != nil {
		return api.Policy{}, api.BadRequest(err)
	}
	b, _ := json.Marshal(policy.Policy{Tribe: tribe, Expr: expr})
	if _, err := n.replica.Put(ctx, policiesPrefix+name, b); err != nil {
		return api.Policy{}, writeErr(err)
	}
	return api.Policy{Name: name, Tribe: tribe, Expr: expr}, nil
}

// Policies implements api.Agent.
func (n *Node) Policies(ctx context.Context) ([]api.Policy, error) {
	out := []api.Policy{}
	for _, e := range n.replica.Prefix(policiesPrefix) {
		p, _, err := readPolicy(e)
		ap := api.Policy{Name: strings.TrimPrefix(e.Key, policiesPrefix), Tribe: p.Tribe, Expr: p.Expr}
		if err != nil {
			ap.Error = err.Error()
		}
		out = append(out, ap)
	}
	return out, nil
}

// DeletePolicy implements api.Agent. Nodes leave the tribe as they notice.
func (n *Node) DeletePolicy(ctx context.Context, name string) (api.Policy, error) {
	e, ok := n.replica.Get(policiesPrefix + name)
	if !ok {
		return api.Policy{}, api.NotFound(fmt.Errorf("%w %q (see `tribe policy list`)", ErrUnknownPolicy, name))
	}
	var p policy.Policy
	json.Unmarshal(e.Value, &p)
	if _, err := n.replica.Delete(ctx, policiesPrefix+name); err != nil {
		return api.Policy{}, writeErr(err)
	}
	return api.Policy{Name: name, Tribe: p.Tribe, Expr: p.Expr}, nil
}

// TestPolicy implements api.Agent: which nodes of the fleet match expr now,
// by their replicated facts, and why each that errs does.
func (n *Node) TestPolicy(ctx context.Context, expr string) ([]api.Match, error) {
	prg, err := policy.Compile(expr)
	if err != nil {
		return nil, api.BadRequest(err)
	}
	out := []api.Match{}
	for id, rec := range n.nodeRecords() {
		if err := ctx.Err(); err != nil { // the client left: a costly policy over a large fleet stops here
			return nil, err
		}
		ok, err := prg.Eval(rec.facts())
		m := api.Match{ID: id.String(), Name: rec.Name, Match: ok}
		if err != nil {
			m.Error = err.Error()
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b api.Match) int { return strings.Compare(a.Name+a.ID, b.Name+b.ID) })
	return out, nil
}

// Facts implements api.Agent: a node's facts from the replicated state
// (this node's when node is empty).
func (n *Node) Facts(ctx context.Context, node string) (map[string]any, error) {
	id := n.host.ID()
	if node != "" {
		ids, err := n.resolve([]string{node})
		if err != nil {
			return nil, err
		}
		id = ids[0]
	}
	rec, ok := n.nodeRecords()[id]
	if !ok {
		return nil, api.NotFound(fmt.Errorf("%w %s", ErrUnknownNode, id))
	}
	return rec.facts(), nil
}

// facts decodes a record's facts with whole numbers as ints.
func (r nodeRecord) facts() policy.Facts {
	raw := r.Facts
	if raw == nil && r.raw != nil {
		var only struct {
			Facts json.RawMessage `json:"facts"`
		}
		json.Unmarshal(r.raw, &only)
		raw = only.Facts
	}
	if len(raw) == 0 {
		return policy.Facts{}
	}
	f, err := policy.DecodeJSON(raw)
	if err != nil {
		return policy.Facts{}
	}
	return f
}

// nodeMatches filters records by a CEL expression over their facts.
func nodeMatches(where string) (func(nodeRecord) bool, error) {
	if where == "" {
		return func(nodeRecord) bool { return true }, nil
	}
	prg, err := policy.Compile(where)
	if err != nil {
		return nil, api.BadRequest(err)
	}
	return func(rec nodeRecord) bool {
		ok, _ := prg.Eval(rec.facts())
		return ok
	}, nil
}
