package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// TestToolboxWhatModelsRunFirst: the default image runs what models reach
// for first (pytest, a numpy and matplotlib plot read back with PIL, a first
// git commit with no identity set), and the instructions list what the
// image has and lacks as its manifest, written by its build, says.
func TestToolboxWhatModelsRunFirst(t *testing.T) {
	img := testenv.DefaultImage(t)
	s := startServer(t, serverOpts{image: img})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := s.cli.ImageInspect(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	var manifest struct {
		Has []struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"has"`
		Lacks []string `json:"lacks"`
	}
	if err := json.Unmarshal([]byte(info.Config.Labels[docker.LabelToolbox]), &manifest); err != nil || len(manifest.Has) == 0 {
		t.Fatalf("the image's manifest label %q: %v", info.Config.Labels[docker.LabelToolbox], err)
	}
	instr := s.cs.InitializeResult().Instructions
	for _, e := range manifest.Has {
		if !strings.Contains(instr, " "+e.Name) {
			t.Errorf("the instructions do not list %s, which the image has:\n%s", e.Name, instr)
		}
	}
	for _, name := range []string{"pytest", "numpy", "matplotlib", "PIL"} {
		if !strings.Contains(instr, name+" ") {
			t.Errorf("the instructions do not list %s with its version:\n%s", name, instr)
		}
	}
	if len(manifest.Lacks) == 0 || !strings.Contains(instr, "It lacks "+manifest.Lacks[0]) {
		t.Errorf("the instructions do not say what the image lacks (%v):\n%s", manifest.Lacks, instr)
	}

	s.ok("sandbox_write_file", map[string]any{"path": "test_calc.py", "content": "def test_add():\n    assert 1 + 1 == 2\n"})
	out := s.ok("sandbox_exec", map[string]any{"command": "pytest -q test_calc.py"})
	if out["exit_code"].(float64) != 0 || !strings.Contains(out["stdout"].(string), "1 passed") {
		t.Errorf("pytest: %v", out)
	}
	plot := `import numpy as np, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from PIL import Image
x = np.linspace(0, 1, 50)
plt.plot(x, x ** 2)
plt.savefig("plot.png")
print(Image.open("plot.png").size)
`
	s.ok("sandbox_write_file", map[string]any{"path": "plot.py", "content": plot})
	out = s.ok("sandbox_exec", map[string]any{"argv": []string{"python3", "plot.py"}, "timeout_ms": 120000})
	if out["exit_code"].(float64) != 0 || strings.TrimSpace(out["stdout"].(string)) != "(640, 480)" {
		t.Errorf("numpy, matplotlib and PIL: %v", out)
	}
	out = s.ok("sandbox_exec", map[string]any{"command": "git init -q && git add -A && git commit -qm first && git log --format='%an <%ae> on %D'"})
	if out["exit_code"].(float64) != 0 || !strings.Contains(out["stdout"].(string), "sandbox <sandbox@sandbox-mcp.invalid> on HEAD -> main") {
		t.Errorf("a first commit: %v", out)
	}
}
