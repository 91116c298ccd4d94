package testimage

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var tagPattern = regexp.MustCompile(`^sandbox-mcp-test:[0-9a-f]{12}$`)

// TestTagMatchesBuildScript keeps Tag and build.sh in step: both must name the
// same tag. It runs the script from another directory, which also checks that
// the script finds its own files wherever it is called from.
func TestTagMatchesBuildScript(t *testing.T) {
	script, err := filepath.Abs("build.sh")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", script, "--print-tag")
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bash build.sh --print-tag: %v\n%s", err, out)
	}
	got := strings.TrimSpace(string(out))
	if got != Tag() {
		t.Fatalf("build.sh --print-tag = %q, Tag() = %q", got, Tag())
	}
	if !tagPattern.MatchString(got) {
		t.Fatalf("tag %q does not match %s", got, tagPattern)
	}
}
