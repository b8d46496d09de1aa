package events

import "time"

// Event types. Liveness events are "node-" plus the liveness value
// ("node-alive", "node-suspect", "node-dead", and any value added later,
// such as "node-left"): a watcher that does not know a value still gets it.
const (
	NodeJoined    = "node-joined"  // a node's first record: it joined the fleet
	NodeRemoved   = "node-removed" // its record was deleted
	TribeCreated  = "tribe-created"
	TribeDeleted  = "tribe-deleted"
	MemberAdded   = "member-added" // Via says how: "manual", or policy names
	MemberChanged = "member-changed"
	MemberRemoved = "member-removed"
	PolicyCreated = "policy-created"
	PolicyUpdated = "policy-updated"
	PolicyDeleted = "policy-deleted"
	PluginLoaded  = "plugin-loaded" // asked of every member of Tribe
	PluginUpdated = "plugin-updated"
	PluginUnload  = "plugin-unloaded"
	PluginState   = "plugin-state" // one member says how loading went: State loaded, error or unloaded
	Admission     = "admission"    // State admitted or revoked, or "none" when the admission was deleted
	Dropped       = "dropped"      // Count events were lost because this watcher fell behind

	// LivenessPrefix starts the type of every liveness event.
	LivenessPrefix = "node-"
)

// Event is one thing that happened in the fleet, as this agent saw it. Key
// is the state key it comes from (liveness events carry the node's record
// key, nodes/<peer>, so that --prefix filters them with the node's other
// events); the other fields are set when they mean something for the type.
type Event struct {
	Time   time.Time `json:"time"`
	Type   string    `json:"type"`
	Key    string    `json:"key,omitempty"`
	Node   string    `json:"node,omitempty"` // peer ID
	Name   string    `json:"name,omitempty"` // node name; policy name for policy events
	Tribe  string    `json:"tribe,omitempty"`
	Plugin string    `json:"plugin,omitempty"`
	Via    []string  `json:"via,omitempty"`
	// State is the new liveness, plugin state or admission; From the one
	// before, when there was one.
	State   string `json:"state,omitempty"`
	From    string `json:"from,omitempty"`
	Version string `json:"version,omitempty"`
	Expr    string `json:"expr,omitempty"`
	Error   string `json:"error,omitempty"`
	Count   int64  `json:"count,omitempty"`
}
