package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/moby/moby/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"

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

// TestServerListsTemplates: the built server, given templates in its
// config file, lists them in its instructions (one line each) and in
// sandbox://policy, and still runs the default sandbox's commands.
func TestServerListsTemplates(t *testing.T) {
	img := testenv.TestImage(t)
	file := writeConfig(t, t.TempDir(), `{"templates": {
		"small": {"image": "`+img+`", "memory": "128MiB", "max-workspace-bytes": "32MiB", "pids": 64},
		"locked": {"read-only": true, "exec": "deny"}}}`)
	s := startServer(t, serverOpts{args: []string{"--config", file}})
	got := s.cs.InitializeResult().Instructions
	for _, want := range []string{
		"\n- locked: image " + img,
		"no network; 256 MiB memory, 1 CPU, 256 processes, 64 MiB workspace; no commands; read-only workspace.",
		"\n- small: image " + img,
		"no network; 128 MiB memory, 1 CPU, 64 processes, 32 MiB workspace.",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("instructions lack %q:\n%s", want, got)
		}
	}
	rr, err := s.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "sandbox://policy"})
	if err != nil {
		t.Fatal(err)
	}
	if text := rr.Contents[0].Text; !strings.Contains(text, `"name": "locked"`) || !strings.Contains(text, `"name": "small"`) {
		t.Errorf("policy resource without the templates:\n%s", text)
	}
	res, err := s.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"argv": []string{"echo", "hi"}}})
	if err != nil || res.IsError {
		t.Fatalf("default sandbox exec: %v %+v", err, res)
	}

	// A caller picks a template by name with sandbox_create; its calls
	// get the template's limits and policy, never more.
	small := s.ok("sandbox_create", map[string]any{"template": "small"})
	if small["template"] != "small" {
		t.Fatalf("sandbox_create template small: %v", small)
	}
	mem := s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"}, "sandbox": small["sandbox"]})
	if strings.TrimSpace(mem["stdout"].(string)) != "134217728" {
		t.Fatalf("the small template's sandbox has memory.max %v, want 128 MiB", mem)
	}
	locked := s.ok("sandbox_create", map[string]any{"template": "locked"})["sandbox"]
	s.fails("sandbox_write_file", map[string]any{"path": "a.txt", "content": "x", "sandbox": locked}, "READ_ONLY")
	s.fails("sandbox_exec", map[string]any{"argv": []string{"true"}, "sandbox": locked}, "POLICY_DENIED")
	s.fails("sandbox_create", map[string]any{"template": "huge"}, "INVALID_ARGUMENT")
}

// TestTemplateImageMissing: a template whose image is not on the engine
// does not hold the server back. The server starts and prepares, the
// default sandbox and the other templates run, the log names the template
// and the image, and that template's sandbox_create is UNAVAILABLE saying
// which template, which image and what the operator does. Once the image
// is there, the same server starts that template's sandboxes.
func TestTemplateImageMissing(t *testing.T) {
	img := testenv.TestImage(t)
	var b [4]byte
	rand.Read(b[:])
	late := "sandbox-mcp-test-late-template:" + hex.EncodeToString(b[:])
	file := writeConfig(t, t.TempDir(), `{"templates": {
		"late": {"image": "`+late+`"},
		"here": {"image": "`+img+`", "memory": "128MiB"}}}`)
	s := startServer(t, serverOpts{args: []string{"--config", file}})
	if out := s.ok("sandbox_exec", map[string]any{"argv": []string{"echo", "default"}}); out["stdout"] != "default\n" {
		t.Fatalf("the default sandbox: %v", out)
	}
	if warn := "templates=late image=" + late; !strings.Contains(s.stderr.String(), warn) {
		t.Errorf("the log does not name the template and its image (%q):\n%s", warn, s.stderr)
	}
	here := s.ok("sandbox_create", map[string]any{"template": "here"})["sandbox"]
	s.ok("sandbox_exec", map[string]any{"argv": []string{"true"}, "sandbox": here})
	msg := s.fails("sandbox_create", map[string]any{"template": "late"}, "UNAVAILABLE")
	for _, want := range []string{"template late", "image " + late + " is not on this Docker engine", "build or load", "config file", "doctor"} {
		if !strings.Contains(msg, want) {
			t.Errorf("sandbox_create of the template without its image: %q lacks %q", msg, want)
		}
	}

	// The operator loads the image: the next create prepares and runs it.
	cli := testenv.Engine(t)
	if _, err := cli.ImageTag(context.Background(), client.ImageTagOptions{Source: img, Target: late}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = cli.ImageRemove(context.Background(), late, client.ImageRemoveOptions{})
	})
	got := s.ok("sandbox_create", map[string]any{"template": "late"})
	if out := s.ok("sandbox_exec", map[string]any{"argv": []string{"echo", "late"}, "sandbox": got["sandbox"]}); out["stdout"] != "late\n" {
		t.Fatalf("the template once its image is there: %v", out)
	}
}
