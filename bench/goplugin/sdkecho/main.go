// Command sdkecho is an echo plugin served with tribe's plugins/sdk.
package main

import (
	"context"
	"encoding/json"

	"github.com/tribeagent/tribe/plugins/sdk"
)

type echo struct{}

func (echo) Echo(ctx context.Context, args json.RawMessage) (json.RawMessage, error) {
	return args, nil
}

func main() { sdk.Main(sdk.Info{Version: "1", Kind: "processor"}, echo{}) }
