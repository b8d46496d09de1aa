// Package goplugin measures, side by side, one call's overhead through
// tribe's external plugin protocol (line-delimited JSON-RPC 2.0 on stdio,
// package plugins/external) and through hashicorp/go-plugin (gRPC over a
// local socket), each to an echo plugin in its own process. It is a module
// of its own so that the tribe binary does not link go-plugin and gRPC.
package goplugin

import (
	"context"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Handshake is the go-plugin handshake both sides share.
var Handshake = plugin.HandshakeConfig{ProtocolVersion: 1, MagicCookieKey: "TRIBE_BENCH", MagicCookieValue: "echo"}

// The gRPC service, written out by hand (no protoc): one method taking and
// returning bytes, with protobuf's wrapper type as the message.
const method = "/tribe.bench.Echo/Echo"

var serviceDesc = grpc.ServiceDesc{
	ServiceName: "tribe.bench.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Echo", Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.BytesValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		return in, nil // echo
	}}},
}

// EchoPlugin is the go-plugin plugin: a gRPC echo service.
type EchoPlugin struct{ plugin.NetRPCUnsupportedPlugin }

func (EchoPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	s.RegisterService(&serviceDesc, struct{}{})
	return nil
}

func (EchoPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return Client{c}, nil
}

// Client calls the echo service.
type Client struct{ conn *grpc.ClientConn }

func (c Client) Echo(ctx context.Context, b []byte) ([]byte, error) {
	out := new(wrapperspb.BytesValue)
	if err := c.conn.Invoke(ctx, method, wrapperspb.Bytes(b), out); err != nil {
		return nil, err
	}
	return out.Value, nil
}
