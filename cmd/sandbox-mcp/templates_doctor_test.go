package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

// TestDoctorChecksTemplateImages: doctor checks every template's image on
// the engine and says what to fix for a missing one.
func TestDoctorChecksTemplateImages(t *testing.T) {
	img := testenv.TestImage(t) // skips under -short before the build
	dir := t.TempDir()
	file := writeConfig(t, dir, `{"templates": {
		"here": {"image": "`+img+`", "memory": "256MiB", "max-workspace-bytes": "64MiB"},
		"gone": {"image": "sandbox-mcp-no-such-template-image:0"}}}`)
	var out bytes.Buffer
	code := doctor(context.Background(), []string{"--config", file, "--image", img, "--state-dir", dir}, &out, envFrom(map[string]string{"HOME": dir}))
	s := out.String()
	if code == 0 {
		t.Fatalf("doctor passed with a template image missing:\n%s", s)
	}
	for _, want := range []string{
		"FAIL  template gone: image sandbox-mcp-no-such-template-image:0 is not on this engine",
		`change the template's "image" in ` + file,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "template here") {
		t.Errorf("a template with the default image was checked twice:\n%s", s)
	}
}
