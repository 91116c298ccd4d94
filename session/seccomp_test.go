package session

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// probeIOURing runs the agent's io_uring probe in a sandbox of m.
func probeIOURing(t *testing.T, m *Manager) string {
	t.Helper()
	return strings.TrimSpace(string(run(t, newSandbox(t, m), docker.AgentPath, "probe-io-uring").Stdout))
}

// engineMajor is the Docker engine's major version.
func engineMajor(t *testing.T, m *Manager) int {
	t.Helper()
	v, err := testenv.Engine(t).ServerVersion(context.Background(), client.ServerVersionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	major, err := strconv.Atoi(strings.SplitN(v.Version, ".", 2)[0])
	if err != nil {
		t.Fatalf("engine version %q: %v", v.Version, err)
	}
	return major
}

// TestSeccompProfileBlocksIOURing: with the example profile (the engine's
// default without io_uring) a sandbox's io_uring_setup fails with EPERM;
// with the engine's default it succeeds on engines before Docker 25.
func TestSeccompProfileBlocksIOURing(t *testing.T) {
	def := testManager(t, nil)
	got := probeIOURing(t, def)
	if engineMajor(t, def) < 25 && got != "allowed" {
		t.Errorf("under the default profile of an engine before 25, io_uring_setup: %q, want allowed", got)
	}

	profile, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "examples", "seccomp-no-io_uring.json"))
	if err != nil {
		t.Fatal(err)
	}
	m := testDockerManager(t, nil, func(c *docker.Config) { c.SeccompProfile = string(profile) })
	if got := probeIOURing(t, m); got != "blocked: EPERM" {
		t.Fatalf("under the example profile, io_uring_setup: %q, want blocked: EPERM", got)
	}
	// The rest of the sandbox works as before.
	if out := string(run(t, newSandbox(t, m), "sh", "-c", "echo ok").Stdout); out != "ok\n" {
		t.Fatalf("a command under the example profile: %q", out)
	}
}
