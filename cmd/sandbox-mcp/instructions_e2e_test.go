package main

import (
	"strings"
	"testing"
)

// TestInitializeHasInstructions: a client gets the instructions built from
// the server's configuration in the initialize result.
func TestInitializeHasInstructions(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--exec", "allowlist", "--allow-cmd", "ls,cat", "--network", "allowlist", "--allow-host", "pypi.org"}})
	got := s.cs.InitializeResult().Instructions
	for _, want := range []string{"Its image is sandbox-mcp-test", "reaches only pypi.org", "only these programs run: ls, cat", "sandbox://policy"} {
		if !strings.Contains(got, want) {
			t.Errorf("instructions lack %q:\n%s", want, got)
		}
	}
}
