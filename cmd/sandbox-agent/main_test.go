package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// TestVersionComesFromTheBuild: the version the agent reports (in
// `sandbox-agent version` and in its hello) is the one its build was linked
// with, and a build linked with none says so instead of a kept string.
func TestVersionComesFromTheBuild(t *testing.T) {
	dir := t.TempDir()
	build := func(name string, args ...string) string {
		t.Helper()
		bin := filepath.Join(dir, name)
		cmd := exec.Command("go", append(append([]string{"build", "-trimpath", "-buildvcs=false", "-o", bin}, args...), ".")...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		out, err := exec.Command(bin, "version").Output()
		if err != nil {
			t.Fatalf("%s version: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	linked := build("linked", "-ldflags", "-X github.com/sandbox-mcp/sandbox-mcp/agent.version=v9.8.7-test")
	if want := fmt.Sprintf("sandbox-agent v9.8.7-test (protocol %d)", agentproto.Version); linked != want {
		t.Fatalf("a build linked with a version says %q, want %q", linked, want)
	}
	plain := build("plain")
	if want := fmt.Sprintf("sandbox-agent dev (protocol %d)", agentproto.Version); plain != want {
		t.Fatalf("a build linked with no version and no VCS stamp says %q, want %q", plain, want)
	}
}
