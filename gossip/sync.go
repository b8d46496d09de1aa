package gossip

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Anti-entropy, pure half. A pull runs in rounds over one stream: the
// puller sends a SyncRequest (digest nodes to compare, keys it wants), the
// other side answers with a SyncResponse (for each node that differs: its
// 16 child hashes, or its few items; and the wanted entries). The puller
// applies the entries, computes its next request with NextPull, and stops
// when there is nothing left to compare or fetch. Everything that differs
// is found by descending only into differing subtrees.

// leafItems is the most items a responder lists for a node instead of
// descending further: listing 16 items (16 bytes each) costs about as much
// as 16 child hashes (8 bytes each) plus the round trip it saves.
const leafItems = 16

// maxRounds bounds one pull: 16 levels of descent plus want rounds.
const maxRounds = 64

// maxNodeReply is the most bytes one node reply takes in a response: the
// node (its depth and value), the reply's kind, and 16 child hashes or
// the count and up to leafItems items (16 bytes each).
const maxNodeReply = 1 + binary.MaxVarintLen64 + 1 + binary.MaxVarintLen64 + leafItems*16

// respondNodeBudget bounds the node replies in one response, as
// respondBudget (syncnet.go) bounds its entries: both, with an entry past
// the latter, fit MaxSyncMessage. Only the entries were bounded: with
// 300,000 keys to bring, the fifth round of a pull probed 64,865 nodes,
// the answer came to 5.2 MB, over the limit, and every pull failed.
const respondNodeBudget = 2 << 20

// Bounds of one request of a pull (NextPull): maxPullProbes probes, whose
// replies fit respondNodeBudget whatever they are, and maxPullWants
// wants, more than one response's entries (respondBudget) ever serve.
// What differs beyond them waits for the next rounds. A request of every
// differing node went over maxProbes at ~2M keys, and the responder
// penalised the puller.
const (
	maxPullProbes = respondNodeBudget / maxNodeReply
	maxPullWants  = 8192
)

// Probe asks the responder to compare one digest node with the puller's
// hash of it.
type Probe struct {
	Node NodeRef
	Hash uint64
}

// SyncRequest is one round of a pull.
type SyncRequest struct {
	Probes []Probe
	Want   []uint64 // key hashes whose entries the puller wants

	// What NextPull found to compare or fetch beyond maxPullProbes and
	// maxPullWants: never sent, carried from one request to the next.
	laterNodes []NodeRef
	laterItems []ItemSummary
}

// ItemSummary is one entry as the digest sees it.
type ItemSummary struct {
	KeyHash, VersionHash uint64
}

// NodeReply is the responder's view of a node that differs.
type NodeReply struct {
	Node     NodeRef
	Children []uint64      // 16 child hashes, or nil
	Items    []ItemSummary // the items under the node, when few
}

// SyncResponse answers a SyncRequest.
type SyncResponse struct {
	Nodes   []NodeReply
	Served  int      // how many of the request's wants were handled
	Entries [][]byte // signed envelopes of the served wants that exist
}

// StartPull is the first request of a pull in scope sc: compare the
// roots.
func (s *State) StartPull(sc Scope) SyncRequest {
	h, _ := s.view(sc).hash(NodeRef{})
	return SyncRequest{Probes: []Probe{{Node: NodeRef{}, Hash: h}}}
}

// Respond answers req from s, comparing in scope sc, sending at most
// budget bytes of entries (at least one entry if any is wanted, so a pull
// always progresses) and respondNodeBudget of node replies: past it the
// rest of the probes go unanswered, as if they were equal (a puller of
// this version never sends that many; one of an earlier version gets
// the rest at its next pull). Wants are served in any scope: a node asks
// for what it needs by key (Replica.FetchKeys).
func (s *State) Respond(req SyncRequest, budget int, sc Scope) SyncResponse {
	var resp SyncResponse
	resp.Nodes, _, _ = s.replyNodes(req.Probes, sc, 0, respondNodeBudget)
	resp.Served, resp.Entries, _ = s.serveWants(req.Want, 0, budget, true)
	return resp
}

// replyNodes answers probes in order, in scope sc, with size bytes of
// replies already in the response, until a reply would pass budget (the
// first always goes): it returns the replies, the bytes of replies now
// in the response, and how many probes it answered.
func (s *State) replyNodes(probes []Probe, sc Scope, size, budget int) (replies []NodeReply, sizeNow, answered int) {
	v := s.view(sc)
	for i, p := range probes {
		if !p.Node.valid() {
			continue
		}
		h, count := v.hash(p.Node)
		if h == p.Hash {
			continue
		}
		reply := NodeReply{Node: p.Node}
		if count <= leafItems || p.Node.Depth == MaxDepth {
			reply.Items = make([]ItemSummary, 0, count)
			v.items(p.Node, func(it digestItem) {
				reply.Items = append(reply.Items, ItemSummary{it.khash, it.vhash})
			})
		} else {
			reply.Children = make([]uint64, 16)
			for i := range 16 {
				reply.Children[i], _ = v.hash(p.Node.Child(i))
			}
		}
		n := replySize(reply)
		if size > 0 && size+n > budget {
			return replies, size, i
		}
		replies = append(replies, reply)
		size += n
	}
	return replies, size, len(probes)
}

// replySize is the size of r as EncodeResponse writes it.
func replySize(r NodeReply) int {
	n := 1 + varintLen(r.Node.Value) + 1
	if r.Children != nil {
		return n + 8*len(r.Children)
	}
	return n + varintLen(uint64(len(r.Items))) + 16*len(r.Items)
}

// serveWants serves wants in order, with used bytes of entries already
// in the response, until an entry would pass budget (the first always
// goes): it returns how many it served, their entries, and the bytes of
// entries now used. Unless direct, a want of a direct entry is answered
// as one not held.
func (s *State) serveWants(wants []uint64, used, budget int, direct bool) (served int, entries [][]byte, usedNow int) {
	for _, kh := range wants {
		e, ok := s.byKeyHash(kh)
		if ok && !direct && s.isDirect != nil && s.isDirect(e.Key) {
			ok = false // answered as not held
		}
		if ok && used > 0 && used+len(e.Raw) > budget {
			break
		}
		served++
		if ok {
			entries = append(entries, e.Raw)
			used += len(e.Raw)
		}
	}
	return served, entries, used
}

// NextPull computes the request after req got resp, against s as it is now
// (with resp's entries applied), comparing in scope sc. done means the
// pull is complete. claim, if not nil, is asked before an entry is
// wanted: an entry it refuses is left out (another pull of this replica
// fetches that very version). A request has at most maxPullProbes probes
// and maxPullWants wants: the rest are carried in it to the next
// requests, oldest first, hashed and looked up again as they go.
func (s *State) NextPull(req SyncRequest, resp SyncResponse, sc Scope, claim func(ItemSummary) bool) (next SyncRequest, done bool) {
	v := s.view(sc)
	if resp.Served < len(req.Want) {
		next.Want = append(next.Want, req.Want[max(resp.Served, 0):]...)
	}
	asked := make(map[NodeRef]bool, len(req.Probes))
	for _, p := range req.Probes {
		asked[p.Node] = true
	}
	nodes, items := slices.Clip(req.laterNodes), slices.Clip(req.laterItems)
	for _, r := range resp.Nodes {
		if !asked[r.Node] || !r.Node.valid() {
			continue // not ours to act on
		}
		switch {
		case r.Children != nil:
			if len(r.Children) != 16 || r.Node.Depth >= MaxDepth {
				continue
			}
			for i, theirs := range r.Children {
				child := r.Node.Child(i)
				if mine, _ := v.hash(child); mine != theirs {
					nodes = append(nodes, child)
				}
			}
		default:
			lo, hi := r.Node.span()
			for _, it := range r.Items {
				if it.KeyHash >= lo && it.KeyHash <= hi {
					items = append(items, it)
				}
			}
		}
	}
	n := min(len(nodes), maxPullProbes)
	for _, node := range nodes[:n] {
		mine, _ := v.hash(node) // as of now: entries came since
		next.Probes = append(next.Probes, Probe{Node: node, Hash: mine})
	}
	next.laterNodes = nodes[n:]
	i := 0
	for ; i < len(items) && len(next.Want) < maxPullWants; i++ {
		it := items[i]
		if _, mine, ok := v.lookup(it.KeyHash); (!ok || mine != it.VersionHash) && (claim == nil || claim(it)) {
			next.Want = append(next.Want, it.KeyHash)
		}
	}
	next.laterItems = items[i:]
	return next, len(next.Probes) == 0 && len(next.Want) == 0
}

// CheckRequest checks that req could come from NextPull: no node probed
// twice, none with one of its ancestors, and no key wanted twice (the
// nodes a pull probes or takes items from are disjoint subtrees). A
// responder builds a reply for each probe before it can tell the
// response is over MaxSyncMessage: 1.25 MiB of one node probed 131,072
// times made it allocate 75 MiB. Disjoint, the probes of one request
// walk each item of the digest at most once (twice with the child
// hashes): every node at depths 1 to 4 made a responder list the whole
// digest at each depth.
func CheckRequest(req SyncRequest) error {
	type span struct {
		n      NodeRef
		lo, hi uint64
	}
	probes := make([]span, len(req.Probes))
	for i, p := range req.Probes {
		if !p.Node.valid() {
			return badSync("bad node %d/%x", p.Node.Depth, p.Node.Value)
		}
		lo, hi := p.Node.span()
		probes[i] = span{p.Node, lo, hi}
	}
	// By where they start, an ancestor before its descendants: nodes of
	// a tree either nest or are disjoint, so one that nests in another
	// nests in the one just before it.
	slices.SortFunc(probes, func(a, b span) int {
		return cmp.Or(cmp.Compare(a.lo, b.lo), cmp.Compare(a.n.Depth, b.n.Depth))
	})
	for i := 1; i < len(probes); i++ {
		a, b := probes[i-1], probes[i]
		switch {
		case a.n == b.n:
			return badSync("node %d/%x probed twice", b.n.Depth, b.n.Value)
		case b.lo <= a.hi:
			return badSync("node %d/%x probed with its ancestor %d/%x", b.n.Depth, b.n.Value, a.n.Depth, a.n.Value)
		}
	}
	wants := slices.Clone(req.Want)
	slices.Sort(wants)
	for i := 1; i < len(wants); i++ {
		if wants[i] == wants[i-1] {
			return badSync("key %x wanted twice", wants[i])
		}
	}
	return nil
}

// ErrUnwanted is an entry in a sync response that the puller did not ask
// for.
var ErrUnwanted = errors.New("gossip: sync entry not asked for")

// CheckResponse checks that resp could be Respond's answer to req: replies
// only for nodes req probed, each once, with children only above MaxDepth
// and items in key-hash order within the node; no more wants served than
// asked, and at least one if any was (Respond always serves one, so a
// pull progresses); no more entries than wants served (ErrUnwanted). The
// rest is ErrBadSyncMessage.
//
// Checked before any entry is opened, it bounds what a responder can make
// a puller spend: one signature check per want the puller sent (the shell
// checks that each entry is for one of them, see ServedWants), and no
// rounds without progress.
func CheckResponse(req SyncRequest, resp SyncResponse) error {
	if resp.Served < 0 || resp.Served > len(req.Want) {
		return badSync("%d wants served of %d asked", resp.Served, len(req.Want))
	}
	if len(req.Want) > 0 && resp.Served == 0 {
		return badSync("none of %d wants served", len(req.Want))
	}
	if len(resp.Entries) > resp.Served {
		return fmt.Errorf("%w: %d entries for %d wants served", ErrUnwanted, len(resp.Entries), resp.Served)
	}
	open := make(map[NodeRef]bool, len(req.Probes))
	for _, p := range req.Probes {
		open[p.Node] = true
	}
	for _, r := range resp.Nodes {
		if !open[r.Node] {
			return badSync("reply for node %d/%x, not asked about or twice", r.Node.Depth, r.Node.Value)
		}
		open[r.Node] = false
		if r.Children != nil {
			if len(r.Children) != 16 || r.Node.Depth >= MaxDepth {
				return badSync("%d children for node %d/%x", len(r.Children), r.Node.Depth, r.Node.Value)
			}
			continue
		}
		lo, hi := r.Node.span()
		for i, it := range r.Items {
			if it.KeyHash < lo || it.KeyHash > hi || i > 0 && it.KeyHash <= r.Items[i-1].KeyHash {
				return badSync("item %x out of place under node %d/%x", it.KeyHash, r.Node.Depth, r.Node.Value)
			}
		}
	}
	return nil
}

// ServedWants are the key hashes that resp's entries may be for: the wants
// of req it served. resp must have passed CheckResponse.
func ServedWants(req SyncRequest, resp SyncResponse) map[uint64]bool {
	wanted := make(map[uint64]bool, resp.Served)
	for _, kh := range req.Want[:resp.Served] {
		wanted[kh] = true
	}
	return wanted
}
