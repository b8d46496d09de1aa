// Command grpcecho is an echo plugin served with hashicorp/go-plugin.
package main

import (
	"github.com/hashicorp/go-plugin"

	"github.com/tribeagent/tribe/bench/goplugin"
)

func main() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: goplugin.Handshake,
		Plugins:         plugin.PluginSet{"echo": goplugin.EchoPlugin{}},
		GRPCServer:      plugin.DefaultGRPCServer,
	})
}
