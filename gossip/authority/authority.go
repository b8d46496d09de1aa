// Package authority decides whose entries count and who may call what,
// from what trusted writers signed. It is the trust model's pure core: no
// I/O, no clock, no goroutines. The node reads the replicated state, hands
// the pieces to these functions and acts on the answers.
//
// The model (DESIGN.md, "Trust model"): authority comes only from trusted
// writers' signatures, never from what a node says about itself.
//
//   - With trusted writers set, a node counts (its record, its policy
//     memberships, its manual memberships) once a trusted writer has
//     admitted it with an admitted/<peer> entry; until then it is Pending.
//     A revocation is an entry too (state "revoked"), so it is not undone
//     by an automatic admission. Trusted writers always count.
//   - A policy membership counts only for the policies that exist, name
//     that tribe and match the member's replicated facts (Backing).
//   - Who may call a plugin is granted on the plugin's entry (Grant):
//     trusted writers always; members of named tribes, or every admitted
//     node, only if the entry says so.
//   - With no trusted writers (open trust) every node counts and every
//     caller is trusted, as the agent says in its log and status.
//
// Drive it by building Rules from the trust list and the admission
// entries, then asking Counts, Status, Backing and Grant.Allows.
package authority

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tribeagent/tribe/gossip"
)

// AdmittedPrefix is where admissions live: admitted/<peer>, written by
// trusted writers only (gossip's authorisation table).
const AdmittedPrefix = "admitted/"

// Status is how a node stands with the trust list.
type Status string

const (
	// Open: there are no trusted writers; every node counts.
	Open Status = "open"
	// Trusted: the node is a trusted writer.
	Trusted Status = "trusted"
	// Admitted: a trusted writer admitted the node.
	Admitted Status = "admitted"
	// Pending: nobody has admitted the node yet; its entries count for
	// nothing.
	Pending Status = "pending"
	// Revoked: a trusted writer revoked the node's admission.
	Revoked Status = "revoked"
)

// Admission is the value of admitted/<peer>.
type Admission struct {
	// State is "admitted" or "revoked".
	State Status `json:"state"`
	// Name is the node's name when it was admitted (for the operator).
	Name string `json:"name,omitempty"`
}

// ErrBadAdmission is returned for an admission value that is not one.
var ErrBadAdmission = errors.New("authority: malformed admission")

// DecodeAdmission reads an admitted/<peer> value.
func DecodeAdmission(b []byte) (Admission, error) {
	var a Admission
	if err := json.Unmarshal(b, &a); err != nil {
		return Admission{}, fmt.Errorf("%w: %v", ErrBadAdmission, err)
	}
	if a.State != Admitted && a.State != Revoked {
		return Admission{}, fmt.Errorf("%w: state %q", ErrBadAdmission, a.State)
	}
	return a, nil
}

// Rules are the trust list and the admissions, as the state holds them.
type Rules struct {
	trusted   map[peer.ID]bool
	admission func(peer.ID) (Status, bool)
}

// NewRules makes the rules for a trust list (none means open trust, and
// the map is kept, not copied) and a look-up of the admissions in the
// state (Admitted or Revoked, and whether there is one); the look-up must
// be safe for concurrent use.
func NewRules(trusted map[peer.ID]bool, admission func(peer.ID) (Status, bool)) Rules {
	return Rules{trusted: trusted, admission: admission}
}

// Open reports whether there are no trusted writers.
func (r Rules) Open() bool { return len(r.trusted) == 0 }

// Status says how id stands.
func (r Rules) Status(id peer.ID) Status {
	switch {
	case r.Open():
		return Open
	case r.trusted[id]:
		return Trusted
	}
	if r.admission != nil {
		if s, ok := r.admission(id); ok {
			return s
		}
	}
	return Pending
}

// Counts reports whether id's entries count.
func (r Rules) Counts(id peer.ID) bool {
	switch r.Status(id) {
	case Open, Trusted, Admitted:
		return true
	}
	return false
}

// IsTrusted reports whether id may write trusted keys and call anything.
func (r Rules) IsTrusted(id peer.ID) bool { return r.Open() || r.trusted[id] }

// PolicyRef is a policy as the state holds it.
type PolicyRef struct {
	Tribe string
	Expr  string
}

// Candidates returns the distinct policies among claimed that exist and
// name tribe, in claimed's order: the only ones worth evaluating. However
// long the claim (an attacker's may repeat one name thousands of times),
// there are at most as many as there are policies.
func Candidates(tribe string, claimed []string, policies map[string]PolicyRef) []string {
	var out []string
	seen := make(map[string]bool, len(policies))
	for _, name := range claimed {
		if seen[name] {
			continue
		}
		seen[name] = true
		if p, ok := policies[name]; ok && p.Tribe == tribe {
			out = append(out, name)
		}
	}
	return out
}

// Backing returns the policies among claimed that back a membership of
// tribe: those that exist, name tribe and match the member's facts by
// match (which evaluates an expression over them; it is called once per
// candidate). None means the membership counts for nothing. The result
// keeps claimed's order.
func Backing(tribe string, claimed []string, policies map[string]PolicyRef, match func(expr string) bool) []string {
	var out []string
	for _, name := range Candidates(tribe, claimed, policies) {
		if match(policies[name].Expr) {
			out = append(out, name)
		}
	}
	return out
}

// Callers are granted on a plugin's entry.
const (
	// CallersAdmitted grants every node that counts.
	CallersAdmitted = "admitted"
	// CallersMembers grants the members of the plugin's own tribe.
	CallersMembers = "members"
	// callersTribe prefixes a grant to another tribe's members.
	callersTribe = "tribe:"
)

// ErrBadGrant is returned for a caller grant that is not one.
var ErrBadGrant = errors.New("authority: bad caller grant")

// Grant is who, besides trusted writers, may call a plugin loaded in a
// tribe: the plugin entry's `callers`. Empty grants only trusted writers.
type Grant []string

// Check reports the first grant that is not "admitted", "members" or
// "tribe:NAME".
func (g Grant) Check() error {
	for _, c := range g {
		switch {
		case c == CallersAdmitted, c == CallersMembers:
		case strings.HasPrefix(c, callersTribe) && gossip.ValidName(strings.TrimPrefix(c, callersTribe)):
		default:
			return fmt.Errorf("%w %q: use %q, %q or \"tribe:NAME\"", ErrBadGrant, c, CallersAdmitted, CallersMembers)
		}
	}
	return nil
}

// Tribes are the tribes whose members g grants, own being the plugin's
// tribe.
func (g Grant) Tribes(own string) []string {
	var out []string
	for _, c := range g {
		t := ""
		switch {
		case c == CallersMembers:
			t = own
		case strings.HasPrefix(c, callersTribe):
			t = strings.TrimPrefix(c, callersTribe)
		}
		if t != "" && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// Allows reports whether caller may call a plugin loaded in tribe own
// under grant g. member tells whether caller is a member that counts of a
// tribe; it is asked only for the tribes g names.
func (g Grant) Allows(r Rules, caller peer.ID, own string, member func(tribe string) bool) bool {
	if r.IsTrusted(caller) {
		return true
	}
	if !r.Counts(caller) {
		return false
	}
	if slices.Contains(g, CallersAdmitted) {
		return true
	}
	for _, t := range g.Tribes(own) {
		if member(t) {
			return true
		}
	}
	return false
}
