package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/policy"
)

// errRecordRefused is a node record admitRecord does not take.
var errRecordRefused = errors.New("node record refused")

// Bounds of what a node says of itself in its record, besides the
// record's size (gossip.MaxValueLen) and its facts' (policy's bounds).
const (
	maxNameLen    = 64  // as --name
	maxVersionLen = 128 // a build's version string
)

// checkRecord reports why the value of a nodes/<peer> entry cannot be
// taken: it must read as a record, its name, version and addresses must
// be printable text of bounded length (they are shown to operators, and
// names resolve), and its facts must be within policy's bounds (other
// nodes evaluate them). Any peer that can connect writes its own record,
// and it is held and shown while the node is pending: this is what keeps
// a stranger's text out of operators' terminals and tables.
func checkRecord(v []byte) error {
	var rec nodeRecord
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

// admitRecord is the replica's Admit for node records (see admit): a
// record checkRecord refuses is not stored, and counted record_refused;
// the node's previous record, if any, stays.
func (n *Node) admitRecord(e *gossip.Signed) error {
	if e.Deleted {
		return nil
	}
	if err := checkRecord(e.Value); err != nil {
		n.recordRefused.Add(1)
		return fmt.Errorf("%w: %w: %s: %w", gossip.ErrValueRefused, errRecordRefused, e.Key, err)
	}
	return nil
}

// admit is the replica's Admit (gossip.ReplicaConfig.Admit): what the
// authorisation table cannot check of an entry from a peer.
func (n *Node) admit(e *gossip.Signed, held func(string) (*gossip.Signed, bool)) error {
	if strings.HasPrefix(e.Key, nodesPrefix) {
		return n.admitRecord(e)
	}
	return n.admitAck(e, held)
}
