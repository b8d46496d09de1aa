package node

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/gossip/authority"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/policy"
)

// Admission: trusted writers admit nodes (by hand or by --auto-admit) and
// revoke them, each an admitted/<peer> entry that binds the node's name.

// ErrOpenTrust is returned for admission commands on an agent with no
// trusted writers.
var ErrOpenTrust = errors.New("trust is open (the agent has no --trusted writers): every node counts, there is nothing to admit")

// Admit implements api.Agent: it admits the named nodes, or with
// AllPending every pending node whose name no node that counts holds.
// Admitting an admitted node again binds the name its record carries now
// (how a node is renamed). With Name, the one node given by peer ID is
// admitted under that name, whether or not its record has come: an
// operator admits a host ahead of its first start, or one whose record
// the bound on pending records keeps out (anyone can fill it with records
// of made-up nodes; see gossip.MaxPending).
func (n *Node) Admit(ctx context.Context, req api.AdmitRequest) ([]api.Admission, error) {
	rules := n.rules()
	if rules.Open() {
		return nil, api.BadRequest(ErrOpenTrust)
	}
	nodes, allPending := req.Nodes, req.AllPending
	if len(nodes) > 0 && allPending {
		return nil, api.BadRequest(errors.New("name nodes or --all-pending, not both"))
	}
	if err := n.replica.Trust().Authorize(authority.AdmittedPrefix+n.host.ID().String(), n.host.ID()); err != nil {
		return nil, writeErr(err)
	}
	names := n.allNames()
	var ids []peer.ID
	if req.Name != "" {
		id, err := admitAhead(req)
		if err != nil {
			return nil, api.BadRequest(err)
		}
		ids = []peer.ID{id}
	} else if allPending {
		for _, id := range slices.Sorted(maps.Keys(names)) {
			if rules.Status(id) == authority.Pending {
				ids = append(ids, id)
			}
		}
	} else {
		var err error
		if ids, err = n.resolveForAdmission(nodes, names); err != nil {
			return nil, err
		}
	}
	out := []api.Admission{}
	for _, id := range ids {
		name := cmp.Or(req.Name, names[id].Name)
		res := api.Admission{ID: id.String(), Name: name, Admission: string(rules.Status(id))}
		bound, admitted := n.auth.admittedName(id)
		switch {
		case rules.Status(id) == authority.Trusted:
			res.Error = "a trusted writer counts without admission"
		case admitted && bound == name:
			// nothing to change
		default:
			if holder, taken := n.nameHolder(rules, name, id); taken {
				res.Error = fmt.Sprintf("name %q is held by node %s: start this node with another --name, or revoke the holder first", name, holder)
				if !allPending {
					return nil, api.BadRequest(errors.New(res.Error))
				}
				break
			}
			if err := n.writeAdmission(ctx, id, authority.Admission{State: authority.Admitted, Name: name}); err != nil {
				return nil, err
			}
			res.Admission = string(authority.Admitted)
		}
		out = append(out, res)
	}
	return out, nil
}

// Revoke implements api.Agent: the nodes' entries stop counting, and an
// automatic admission does not bring them back (tribe admit does). A name
// resolves among the nodes that count, so a pending node cannot make a
// revocation ambiguous; a peer ID may name any node.
func (n *Node) Revoke(ctx context.Context, nodes []string) ([]api.Admission, error) {
	rules := n.rules()
	if rules.Open() {
		return nil, api.BadRequest(ErrOpenTrust)
	}
	ids, err := n.distinctNodes(nodes)
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
		rec, _ := n.nodeNamed(id)
		if err := n.writeAdmission(ctx, id, authority.Admission{State: authority.Revoked, Name: rec.Name}); err != nil {
			return nil, err
		}
		out = append(out, api.Admission{ID: id.String(), Name: rec.Name, Admission: string(authority.Revoked)})
	}
	return out, nil
}

// admitAhead checks an admission under a name given by the operator: one
// node, by peer ID (it may not have announced itself, so a name cannot
// find it), and a name a node could give itself.
func admitAhead(req api.AdmitRequest) (peer.ID, error) {
	if req.AllPending || len(req.Nodes) != 1 {
		return "", errors.New("--name admits one node, given by its peer ID")
	}
	id, err := peer.Decode(req.Nodes[0])
	if err != nil {
		return "", fmt.Errorf("--name admits a node by its peer ID (tribe id on that host prints it): %q is not a peer ID", req.Nodes[0])
	}
	return id, nameErr(req.Name)
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

// resolveForAdmission resolves peer IDs, or names among the records that
// carry them, counted or not (admission is how a node comes to count): a
// name must be carried by exactly one node, else the operator names it by
// peer ID. Like join, it takes at most maxNodesPerRequest distinct names
// and gives each node once.
func (n *Node) resolveForAdmission(nodes []string, names map[peer.ID]nodeName) ([]peer.ID, error) {
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
				return nil, api.NotFound(fmt.Errorf("%w %s: no node with that peer ID has announced itself (to admit it ahead of its record: tribe admit %s --name NAME)", ErrUnknownNode, s, s))
			}
			out = append(out, id)
			continue
		}
		switch ids := byName[s]; len(ids) {
		case 0:
			return nil, api.NotFound(fmt.Errorf("%w %q (see `tribe nodes --pending`)", ErrUnknownNode, s))
		case 1:
			out = append(out, ids[0])
		default:
			slices.Sort(ids)
			return nil, api.BadRequest(fmt.Errorf("node name %q is carried by %d nodes (%s): admit one by peer ID", s, len(ids), strings.Join(idStrings(ids), ", ")))
		}
	}
	return distinct(out), nil
}

// autoAdmitEvery is the least time between two passes of --auto-admit:
// a burst of new records (a fleet booting) costs one pass, not one each.
const autoAdmitEvery = time.Second

// autoAdmitLoop admits, as a trusted writer, every pending node whose
// replicated facts match Config.AutoAdmit and whose name no node that
// counts holds. Revoked nodes stay revoked.
func (n *Node) autoAdmitLoop() {
	prg, err := policy.Compile(n.cfg.AutoAdmit)
	if err != nil { // Validate compiled it
		n.log.Error("auto-admit expression", "err", err)
		return
	}
	trigger := n.admitCh
	poke := func(gossip.Change) {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	defer n.replica.Watch(nodesPrefix, poke)()
	defer n.replica.Watch(authority.AdmittedPrefix, poke)()
	poke(gossip.Change{})
	// Each record's verdict, by entry: a record is replaced, never
	// changed, so each is decoded and evaluated once, not at every pass
	// (a pass comes with each new record, and anyone can make records: up
	// to gossip.MaxPending of them, each padded as it likes). One that
	// matched but whose name another node holds stays pending, and only
	// its name is looked at again.
	type verdict struct {
		match bool
		name  string
	}
	judged := map[*gossip.Signed]verdict{}
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-trigger:
		}
		rules := n.rules()
		if rules.Status(n.host.ID()) != authority.Trusted {
			continue // only a trusted writer admits; tribe reload may make this one
		}
		held := n.replica.Prefix(nodesPrefix)
		for e := range judged {
			if cur, ok := n.replica.Get(e.Key); !ok || cur != e {
				delete(judged, e)
			}
		}
		for _, e := range held {
			id, err := peer.Decode(strings.TrimPrefix(e.Key, nodesPrefix))
			if err != nil || rules.Status(id) != authority.Pending {
				continue
			}
			v, ok := judged[e]
			if !ok {
				var rec nodeRecord
				if json.Unmarshal(e.Value, &rec) == nil {
					n.auth.autoAdmitEvals.Add(1)
					v.match, _ = prg.Eval(rec.facts())
					v.name = rec.Name
				}
				judged[e] = v
			}
			if !v.match {
				continue
			}
			if holder, taken := n.nameHolder(rules, v.name, id); taken {
				n.authWarn.warn(n.log, id.String(), "--auto-admit: not admitting a node under a name another node holds", "node", id, "name", v.name, "holder", holder)
				continue
			}
			if err := n.writeAdmission(n.ctx, id, authority.Admission{State: authority.Admitted, Name: v.name}); err != nil {
				if n.ctx.Err() == nil {
					n.log.Warn("auto-admit", "node", id, "err", err)
				}
				continue
			}
			n.log.Info("admitted by --auto-admit", "node", id, "name", v.name)
		}
		if !n.sleep(autoAdmitEvery) {
			return
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
