package main

import (
	"io"

	"github.com/sandbox-mcp/sandbox-mcp/cmd/sandbox-mcp/internal/snapshotcli"
)

// snapshotCmd is `sandbox-mcp snapshot`: the state directory comes from the
// server's own flags, environment and config file.
func snapshotCmd(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	return snapshotcli.Run(args, stdout, stderr, func(args []string) (string, []string, error) {
		cfg, rest, err := parseConfig(args, getenv)
		return cfg.StateDir, rest, err
	})
}
