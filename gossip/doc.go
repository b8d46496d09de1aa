// Package gossip is tribe's replicated state: a last-writer-wins map from
// key to signed entry that every node holds, and that converges on every
// node whatever the order, loss or duplication of messages.
//
// The core is pure, in the style of etcd's raft: State merges entries
// (Apply), finds what two replicas differ on (the digest, StartPull,
// Respond, NextPull, and CheckRequest and CheckResponse, which each side
// runs on what the other sends before acting on it) and collects old
// tombstones (Collect); time comes in as arguments and nothing does I/O.
// Entries are libp2p signed envelopes (Sign, Open) authorised by the
// table in auth.go, deny by default.
//
// The shell, Replica, owns the goroutines, the pubsub topic, the sync
// protocol over streams and the bbolt store: a local write is signed,
// stored, applied and published, and acknowledged only once stored. A
// peer that breaks the sync protocol is refused for SyncCooldown in both
// directions (Penalised); sync buffers grow only with the bytes that
// arrive and are reserved on the stream's resource scope; refusals are
// counted by reason (Rejected).
package gossip
