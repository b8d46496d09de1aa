// Package external runs plugins that are executables in the host's plugin
// dir, in any language: the agent starts one process per loaded instance
// and speaks line-delimited JSON-RPC 2.0 with it over its stdin and stdout
// (package wire); its stderr goes to the agent's log.
//
//	process.go  one running plugin process: handshake, calls, cancel
//	plugin.go   the supervised plugin: restarts, deadlines, stop
//	dir.go      finding the plugins in a dir and loading them
package external
