// Command hello is an example tribe plugin built with package sdk: copy it
// (built, and named hello) into an agent's plugin dir and load it with
// `tribe plugin load hello --tribe T`.
//
//	tribe call --tribe T hello echo '{"any":"json"}'   → the arguments
//	tribe call --tribe T hello greet '{"name":"ada"}'   → "hello, ada, from <hostname>"
package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"

	"github.com/tribeagent/tribe/plugins/sdk"
)

type hello struct{}

// Echo answers with its arguments.
func (hello) Echo(ctx context.Context, args json.RawMessage) (json.RawMessage, error) {
	return args, nil
}

// Greet greets by name, from this host.
func (hello) Greet(ctx context.Context, a struct {
	Name string `json:"name"`
}) (string, error) {
	if a.Name == "" {
		return "", errors.New("greet whom? give a name: {\"name\": \"...\"}")
	}
	host, _ := os.Hostname()
	return "hello, " + a.Name + ", from " + host, nil
}

func main() {
	// No Name: the executable's own file name, hello when built here.
	sdk.Main(sdk.Info{Version: "1.0.0", Kind: "processor"}, hello{})
}
