package node

import (
	"fmt"
	"slices"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/gossip/authority"
	"github.com/tribeagent/tribe/node/api"
)

// Names. A node names itself in its record, but with trusted writers set
// a name is bound when the node is admitted: an admitted node answers to
// the name in its admission (written by a trusted writer), whatever its
// record says later, and no two nodes that count are admitted under one
// name. Trusted writers answer to their records' names; with open trust
// everyone does. Both indexes are kept by watchers, so a record's arrival
// costs no pass over every record.

// checkArrivingRecord indexes a record's name, and counts a record that
// claims a name another node that counts holds: the claim is ignored.
func (n *Node) checkArrivingRecord(c gossip.Change) {
	id, err := peer.Decode(strings.TrimPrefix(c.Key, nodesPrefix))
	if err != nil {
		return
	}
	var rec nodeName
	if c.New != nil && !c.New.Deleted {
		dec, _ := n.recordAt(c.New)
		rec = dec.name()
	} else {
		n.records.Delete(c.Key) // the decoded record goes with its entry
	}
	a := &n.auth
	a.mu.Lock()
	if old, ok := a.nameOf[id]; ok {
		unindex(a.byName, old, id)
		delete(a.nameOf, id)
	}
	if rec.Name != "" {
		a.nameOf[id] = rec.Name
		a.byName[rec.Name] = append(a.byName[rec.Name], id)
	}
	a.mu.Unlock()
	if rec.Name == "" {
		return
	}
	rules := n.rules()
	if n.boundName(rules, id) == rec.Name {
		return
	}
	if holder, ok := n.nameHolder(rules, rec.Name, id); ok {
		n.auth.nameTaken.Add(1)
		n.authWarn.warn(n.log, id.String(), "a node claims a name another node holds; the claim is ignored",
			"name", rec.Name, "claimant", id, "holder", holder)
	}
}

// unindex removes id from idx[name].
func unindex(idx map[string][]peer.ID, name string, id peer.ID) {
	idx[name] = slices.DeleteFunc(idx[name], func(p peer.ID) bool { return p == id })
	if len(idx[name]) == 0 {
		delete(idx, name)
	}
}

// boundName is the name id answers to: its admission's if admitted, its
// record's if trusted (or under open trust), none otherwise.
func (n *Node) boundName(rules authority.Rules, id peer.ID) string {
	switch rules.Status(id) {
	case authority.Admitted:
		name, _ := n.auth.admittedName(id)
		return name
	case authority.Trusted, authority.Open:
		n.auth.mu.Lock()
		defer n.auth.mu.Unlock()
		return n.auth.nameOf[id]
	}
	return ""
}

// named returns the nodes that count and answer to name, reaped ones left
// out: a name is free once its holder is reaped (see reap.go).
func (n *Node) named(rules authority.Rules, name string) []peer.ID {
	n.auth.mu.Lock()
	cands := slices.Concat(n.auth.byName[name], n.auth.admName[name])
	n.auth.mu.Unlock()
	var out []peer.ID
	for _, id := range cands {
		if !slices.Contains(out, id) && n.boundName(rules, id) == name && !n.reaped(id) {
			out = append(out, id)
		}
	}
	return out
}

// nameHolder returns a node other than except that counts and answers to
// name, alive or not: a name is not free while its holder is down.
func (n *Node) nameHolder(rules authority.Rules, name string, except peer.ID) (peer.ID, bool) {
	for _, id := range n.named(rules, name) {
		if id != except {
			return id, true
		}
	}
	return "", false
}

// allNames is every node's name and addresses, counted or not.
func (n *Node) allNames() map[peer.ID]nodeName {
	out := map[peer.ID]nodeName{}
	for _, e := range n.replica.Prefix(nodesPrefix) {
		if c, ok := n.recordAt(e); ok && !c.bad {
			out[c.id] = c.name()
		}
	}
	return out
}

// pick chooses among the nodes that answer to one name: the only one, or
// the only one that has not left when several do. Under open trust, where a host restarted with a fresh data dir leaves
// its old record behind under the same name, the only live one also
// does; with trusted writers a name is bound at admission, and liveness
// (which a node can bend for a while, by answering probes) never breaks
// a tie.
func (n *Node) pick(rules authority.Rules, name string, ids []peer.ID) (peer.ID, error) {
	switch len(ids) {
	case 0:
		n.auth.mu.Lock()
		claimants := len(n.auth.byName[name])
		n.auth.mu.Unlock()
		if claimants > 0 && !rules.Open() {
			return "", api.NotFound(fmt.Errorf("%w %q: no admitted node answers to it, %d pending or revoked nodes claim it (see `tribe nodes`; admit one by peer ID)", ErrUnknownNode, name, claimants))
		}
		return "", api.NotFound(fmt.Errorf("%w %q (see `tribe nodes`)", ErrUnknownNode, name))
	case 1:
		return ids[0], nil
	}
	if stayed := slices.DeleteFunc(slices.Clone(ids), func(id peer.ID) bool { return n.liveness(id) == Left }); len(stayed) == 1 {
		return stayed[0], nil
	}
	if rules.Open() {
		var alive []peer.ID
		for _, id := range ids {
			if n.liveness(id) == Alive {
				alive = append(alive, id)
			}
		}
		if len(alive) == 1 {
			return alive[0], nil
		}
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

// nameOf is a node as a message names it: its name and peer ID, or the ID
// alone for a node with no record here.
func (n *Node) nameOf(id peer.ID) string {
	if rec, ok := n.nodeNamed(id); ok && rec.Name != "" {
		return rec.Name + " (" + id.String() + ")"
	}
	return id.String()
}
