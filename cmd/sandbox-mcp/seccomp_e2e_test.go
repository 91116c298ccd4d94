package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

// TestDoctorIOURing: doctor probes io_uring_setup in a real sandbox. Under
// the default profile of an engine before Docker 25 (this machine's 20.10)
// it warns and names the fix; under the example profile it is satisfied.
func TestDoctorIOURing(t *testing.T) {
	v, err := testenv.Engine(t).ServerVersion(context.Background(), client.ServerVersionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	major, _ := strconv.Atoi(strings.SplitN(v.Version, ".", 2)[0])
	doctor := func(extra ...string) string {
		t.Helper()
		args := append([]string{"doctor", "--image", testenv.TestImage(t), "--agent-bin", bins.Get(t).Agent, "--state-dir", t.TempDir()}, extra...)
		out, err := exec.Command(bins.Get(t).Server, args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "sandbox-mcp is ready.") {
			t.Fatalf("doctor %q: %v\n%s", extra, err, out)
		}
		return string(out)
	}

	out := doctor()
	warning := "warn  sandboxes can call io_uring_setup under the engine's default seccomp profile"
	if major < 25 && (!strings.Contains(out, warning) || !strings.Contains(out, "--seccomp-profile examples/seccomp-no-io_uring.json")) {
		t.Errorf("doctor on Docker %s with the default profile does not warn about io_uring:\n%s", v.Version, out)
	}
	if major >= 25 && !strings.Contains(out, "ok    sandboxes cannot use io_uring") {
		t.Errorf("doctor on Docker %s:\n%s", v.Version, out)
	}

	example := filepath.Join(testenv.RepoRoot(), "examples", "seccomp-no-io_uring.json")
	out = doctor("--seccomp-profile", example)
	if !strings.Contains(out, "ok    sandboxes cannot use io_uring under --seccomp-profile "+example+" (io_uring_setup: EPERM)") || strings.Contains(out, "io_uring_setup under") {
		t.Errorf("doctor with the example profile:\n%s", out)
	}
}
