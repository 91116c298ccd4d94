package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/session/backend/kube"
)

// TestLoadSeedRefusesReadOnlyOnKubernetes: --workspace-from is read in
// one place for whichever backend main built; the Kubernetes backend
// cannot put a read-only workspace's content into its pods, so the loader
// refuses it (behind validateKube's flag check), while a writable
// workspace's content loads for it, and no flag loads nothing.
func TestLoadSeedRefusesReadOnlyOnKubernetes(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte("seed\n"), 0o644)
	cfg := defaultConfig(func(string) string { return "" })
	kb := &kube.Backend{}
	if sd, err := loadSeed(cfg, kb); sd != nil || err != nil {
		t.Fatalf("no --workspace-from: %v, %v", sd, err)
	}
	cfg.WorkspaceFrom = dir
	sd, err := loadSeed(cfg, kb)
	if err != nil {
		t.Fatalf("writable workspace: %v", err)
	}
	sd.Close()
	cfg.Policy.ReadOnly = true
	if sd, err = loadSeed(cfg, kb); err == nil {
		sd.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "read-only workspace cannot start with content") {
		t.Fatalf("read-only workspace on Kubernetes: %v, want a refusal", err)
	}
}
