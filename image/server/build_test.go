// Package server_test checks the image of the server itself: built offline
// from the static binaries, it starts as a non-root user with nothing else
// in it.
package server_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

// TestServerImageRuns builds the image and runs the server in it: the
// binary is static (it starts in an image without a C library), the user is
// the numeric non-root one, and the agent sits beside the server.
func TestServerImageRuns(t *testing.T) {
	tag := testenv.ServerImage(t)
	out, err := exec.Command("docker", "run", "--rm", "--network=none", tag, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "sandbox-mcp ") {
		t.Fatalf("docker run %s version: %v\n%s", tag, err, out)
	}
	cfg, err := exec.Command("docker", "image", "inspect", "-f",
		"{{.Config.User}} {{json .Config.Entrypoint}} {{index .Config.Labels \"io.sandbox-mcp.image\"}}", tag).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(cfg)), `65532:65532 ["/sandbox-mcp"] server`; got != want {
		t.Errorf("image config = %q, want %q", got, want)
	}
	// The agent beside the server is the static one (it runs in any image).
	out, err = exec.Command("docker", "run", "--rm", "--network=none", "--entrypoint", "/sandbox-agent", tag, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("the agent in %s does not run: %v\n%s", tag, err, out)
	}
}

// TestServerImageRefusesDynamicBinary: a binary linked against the C library
// would not start in a FROM scratch image, so the build stops and says how
// to build it.
func TestServerImageRefusesDynamicBinary(t *testing.T) {
	dir := t.TempDir()
	// Any dynamically linked executable of this machine stands in.
	sh, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Skip("no /bin/sh to stand in for a dynamic binary")
	}
	for _, name := range []string{"sandbox-mcp", "sandbox-agent"} {
		if err := os.WriteFile(filepath.Join(dir, name), sh, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script, _ := filepath.Abs("build.sh")
	out, err := exec.Command("bash", script, dir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "CGO_ENABLED=0") {
		t.Fatalf("build.sh with a dynamic binary: err %v, want a failure naming CGO_ENABLED=0\n%s", err, out)
	}
}
