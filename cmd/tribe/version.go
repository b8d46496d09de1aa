package main

import (
	"fmt"
	"runtime"

	"github.com/urfave/cli/v2"

	"github.com/tribeagent/tribe/node"
)

// versionInfo is what `tribe version --json` prints.
type versionInfo struct {
	Version string `json:"version"`
	Go      string `json:"go"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print this binary's version (the running agent's is in tribe status)",
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			v := versionInfo{Version: node.Version, Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
			if flagBool(c, "json") {
				return printJSON(c.App.Writer, v)
			}
			_, err := fmt.Fprintf(c.App.Writer, "tribe %s (%s, %s/%s)\n", v.Version, v.Go, v.OS, v.Arch)
			return err
		},
	}
}
