// Package swim is tribe's failure detector, in the manner of SWIM and
// Lifeguard as hashicorp/memberlist builds them: every ProbeInterval a
// node probes one member (the members in a shuffled round, so each is
// probed within a bounded time), and if no ack comes within ProbeTimeout it
// asks IndirectChecks others to probe it too. Only when none of them hears
// from it is the member suspect; the suspicion becomes dead after a
// timeout that starts at SuspicionMaxMult times the minimum and shrinks
// towards the minimum as other members confirm it independently. A member
// that hears it is suspected refutes it with a higher incarnation. Every
// change (alive, suspect, dead, left) travels piggybacked on probes and
// acks and on a few gossip messages to random members, each a bounded
// number of times (RetransmitMult × log10 N): a node's work per second
// does not grow with the fleet.
//
// The package is split as raft is: Members is the pure core (no clock,
// no goroutines, no network: updates and times in, decisions out), and
// Detector is the shell that runs it on a Transport with goroutines and
// timers. The node wires a Transport over libp2p streams and signs what it
// says (Config.Sign, Config.Verify).
package swim
