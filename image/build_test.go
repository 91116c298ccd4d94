package image_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/image"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

// TestDefaultImageConfig checks the built default image (make image): the
// Dockerfile's instructions are its configuration, and the rootfs is one
// layer (build.sh imports it; no instruction commits a layer of its own).
func TestDefaultImageConfig(t *testing.T) {
	tag := testenv.DefaultImage(t)
	cli := testenv.Engine(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := cli.ImageInspect(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	if cfg.User != "1000:1000" || cfg.WorkingDir != "/workspace" || !slices.Equal(cfg.Cmd, []string{"/bin/bash"}) {
		t.Errorf("user %q, workdir %q, cmd %q; want 1000:1000, /workspace, [/bin/bash]", cfg.User, cfg.WorkingDir, cfg.Cmd)
	}
	for _, want := range []string{
		"LANG=C.UTF-8",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/tmp/.local/bin",
		"PIP_BREAK_SYSTEM_PACKAGES=1",
		"NPM_CONFIG_PREFIX=/tmp/.local",
	} {
		if !slices.Contains(cfg.Env, want) {
			t.Errorf("env %q lacks %s", cfg.Env, want)
		}
	}
	hash := strings.TrimPrefix(image.DefaultTag(), image.Repository+":")
	if cfg.Labels["io.sandbox-mcp.image"] != "default" || cfg.Labels["io.sandbox-mcp.source-hash"] != hash ||
		cfg.Labels["org.opencontainers.image.title"] != "sandbox-mcp default sandbox" {
		t.Errorf("labels %v", cfg.Labels)
	}
	if n := len(info.RootFS.Layers); n != 1 {
		t.Errorf("the image has %d layers, want the imported rootfs alone", n)
	}
}

// TestBuildRefusesBuildSteps: an instruction that docker import cannot apply
// (a RUN) makes build.sh stop at once, before it needs root or the engine,
// with a message that says where such work belongs.
func TestBuildRefusesBuildSteps(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"build.sh", "Dockerfile"} {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if name == "Dockerfile" {
			b = append(b, "RUN apt-get install -y \\\n    golang-go\n"...)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", filepath.Join(dir, "build.sh"))
	cmd.Env = append(os.Environ(), "PATH=/usr/bin:/bin", "DOCKER_HOST=unix:///nonexistent")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("build.sh accepted a RUN instruction:\n%s", out)
	}
	msg := string(out)
	if !strings.Contains(msg, `"RUN apt-get install -y golang-go"`) || !strings.Contains(msg, "do build work in build.sh") {
		t.Fatalf("build.sh did not name the instruction and where it belongs:\n%s", msg)
	}
}
