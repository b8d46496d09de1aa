package node

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/gossip/authority"
	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/policy"
)

// Bounds of what a node says of itself in its record, besides the
// record's size (gossip.MaxValueLen) and its facts' (policy's bounds).
const (
	maxNameLen    = 64  // as --name
	maxVersionLen = 128 // a build's version string
)

// recordText is what checkRecord reads of a record: only the fields it
// checks, so that a later version may change the others.
type recordText struct {
	Name    string          `json:"name"`
	Addrs   []string        `json:"addrs"`
	Version string          `json:"version"`
	Facts   json.RawMessage `json:"facts"`
}

// nameErr says why name is not one other nodes take in a record (at most
// maxNameLen bytes of printable text), or is nil: the rule for --name, a
// name admitted by hand, and the host name a node falls back on.
func nameErr(name string) error {
	if len(name) > maxNameLen || !names.Printable(name) {
		return fmt.Errorf("name %q: at most %d bytes of printable text (no control or format characters)", name, maxNameLen)
	}
	return nil
}

// checkRecord reports why the value of a nodes/<peer> entry cannot be
// taken: it must read as a record, its name, version and addresses must
// be printable text of bounded length (they are shown to operators, and
// names resolve), and its facts must be within policy's bounds (other
// nodes evaluate them). Any peer that can connect writes its own record,
// and it is held and shown while the node is pending: this is what keeps
// a stranger's text out of operators' terminals and tables.
func checkRecord(v []byte) error {
	var rec recordText
	if err := json.Unmarshal(v, &rec); err != nil {
		return fmt.Errorf("not a node record: %w", err)
	}
	switch {
	case len(rec.Name) > maxNameLen:
		return fmt.Errorf("a name of %d bytes, at most %d", len(rec.Name), maxNameLen)
	case !names.Printable(rec.Name):
		return fmt.Errorf("the name %q is not printable text", rec.Name)
	case len(rec.Version) > maxVersionLen:
		return fmt.Errorf("a version of %d bytes, at most %d", len(rec.Version), maxVersionLen)
	case !names.Printable(rec.Version):
		return fmt.Errorf("the version %q is not printable text", rec.Version)
	}
	for _, a := range rec.Addrs {
		if !names.Printable(a) {
			return fmt.Errorf("the address %q is not printable text", a)
		}
	}
	if len(rec.Facts) > 0 {
		if err := policy.CheckJSON(rec.Facts); err != nil {
			return fmt.Errorf("facts past the bounds: %w", err)
		}
	}
	return nil
}

// checkValue is the replica's Value (gossip.ReplicaConfig.Value): what an
// entry's value must hold, whoever sent it. Node records are checked,
// policy memberships, and admissions: one that does not read would revoke
// its node on every node that took it.
func checkValue(e *gossip.Signed) error {
	switch {
	case e.Deleted:
		return nil
	case strings.HasPrefix(e.Key, nodesPrefix):
		return checkRecord(e.Value)
	case strings.HasPrefix(e.Key, authority.AdmittedPrefix):
		_, err := authority.DecodeAdmission(e.Value)
		return err
	case strings.HasPrefix(e.Key, tribesPrefix) && strings.HasSuffix(e.Key, "/policy") && isPolicyMembership(e.Key):
		return checkPolicyMembership(e.Value)
	}
	return nil
}

// Bounds of a policy membership (tribes/<t>/members/<peer>/policy): a node
// names at most maxClaimedPolicies of the policies that put it in the
// tribe (one that exists and matches is enough for it to count), and the
// value is at most maxMembershipValue bytes. A node writes such keys for
// any tribe it likes (gossip.MaxPolicyMemberships of them): without these
// bounds each could be gossip.MaxValueLen of whatever it liked.
const (
	maxClaimedPolicies = 32
	maxMembershipValue = 4 << 10
)

// isPolicyMembership reports whether key is tribes/<t>/members/<peer>/policy
// (not, say, a plugin named policy).
func isPolicyMembership(key string) bool {
	k, err := gossip.Classify(key)
	return err == nil && k.Name == "member-policy"
}

// checkPolicyMembership reports why the value of a policy membership
// cannot be taken: it must read as one, name policies by valid names, at
// most maxClaimedPolicies, in at most maxMembershipValue bytes.
func checkPolicyMembership(v []byte) error {
	if len(v) > maxMembershipValue {
		return fmt.Errorf("a policy membership of %d bytes, at most %d", len(v), maxMembershipValue)
	}
	var rec memberRecord
	if err := json.Unmarshal(v, &rec); err != nil {
		return fmt.Errorf("not a policy membership: %w", err)
	}
	if len(rec.Policies) > maxClaimedPolicies {
		return fmt.Errorf("a policy membership naming %d policies, at most %d", len(rec.Policies), maxClaimedPolicies)
	}
	for _, p := range rec.Policies {
		if !gossip.ValidName(p) {
			return fmt.Errorf("a policy membership naming %q, not a policy name", names.Cut(p, 64, "…"))
		}
	}
	return nil
}
