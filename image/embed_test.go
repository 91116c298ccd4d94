package image

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
)

var tagPattern = regexp.MustCompile(`^sandbox-mcp:[0-9a-f]{12}$`)

// TestDefaultTagMatchesBuildScript keeps DefaultTag and build.sh in step: both
// must name the same tag. It runs the script from another directory, which
// also checks that the script finds its own files wherever it is called from.
func TestDefaultTagMatchesBuildScript(t *testing.T) {
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
	if got != DefaultTag() {
		t.Fatalf("build.sh --print-tag = %q, DefaultTag() = %q", got, DefaultTag())
	}
	if !tagPattern.MatchString(got) {
		t.Fatalf("tag %q does not match %s", got, tagPattern)
	}
}

func TestTagOf(t *testing.T) {
	fsys := fstest.MapFS{"Dockerfile": {Data: []byte("a")}, "build.sh": {Data: []byte("b")}}
	// sha256("ab") = fb8e20fc2e4c3f248c60c39bd652f3c1347298bb977b8b4d5903b85055620603
	if got := TagOf("repo", fsys); got != "repo:fb8e20fc2e4c" {
		t.Fatalf("TagOf = %q", got)
	}
}
