package api

// Join states (Join.State).
const (
	JoinConnecting   = "connecting"    // not connected yet
	JoinUnreachable  = "unreachable"   // the last dial failed; retried with backoff
	JoinConnected    = "connected"     // connected; its hello is not heard yet
	JoinJoined       = "joined"        // connected to a peer of this cluster
	JoinOtherCluster = "other_cluster" // connected, but the peer is of Cluster, not ours
	JoinSelf         = "self"          // the address is this node's own: ignored
	JoinBusy         = "busy"          // it holds as many peers as it keeps and turned this node away, naming others
	JoinDone         = "done"          // it took this node in; not connected now, dialled again only while this node is short of peers
)

// Join is how one --join address fares.
type Join struct {
	Addr    string `json:"addr"`              // as given
	ID      string `json:"id,omitempty"`      // the peer's ID, given or learnt on connect
	State   string `json:"state"`             // one of the Join* states
	Cluster string `json:"cluster,omitempty"` // the peer's cluster, once heard
	Error   string `json:"error,omitempty"`   // why the last dial failed
}
