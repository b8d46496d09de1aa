// Package events is the agent's event stream (`tribe watch`, GET
// /v1/watch): typed events made from changes to the replicated state and
// from liveness transitions, fanned out to watchers that each have a
// bounded buffer.
//
// The package has a pure core and a small fan-out:
//
//	translate.go  Translate: one state change (key, old value, new value)
//	              in, the events it means out. No I/O, no clock.
//	liveness.go   Liveness: samples of each node's liveness in, the
//	              transitions since the last sample out.
//	buffer.go     the per-watcher ring: full, it drops the oldest event and
//	              counts it, and the watcher reads a "dropped" event with
//	              the count before the events that survived.
//	hub.go        Hub: Publish never blocks, whatever the watchers do;
//	              Subscribe and Next are how a watcher reads.
//
// The node drives it: it hands every applied state change to Translate and
// publishes the result, samples liveness every second while anyone
// watches, and serves Subscribe on the control API.
package events
