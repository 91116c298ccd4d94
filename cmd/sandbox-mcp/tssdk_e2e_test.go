package main

// The server through the TypeScript SDK's client (@modelcontextprotocol/sdk),
// on the protocol versions before 2026-07-28, over stdio and HTTP (issue 22
// §2). No npm registry is reachable here: the SDK comes from the MCP
// conformance suite's bundle (../shared/tools/mcp-conformance.cjs, which
// .ci/run runs too); testdata/tssdk_client.cjs says how it is reached.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

// conformanceBundle finds the MCP conformance suite's bundle: $MCP_CONFORMANCE,
// or shared/tools/mcp-conformance.cjs beside the checkout or one of its
// parents (a worktree sits a level deeper than the main checkout).
func conformanceBundle(t *testing.T) string {
	if f := os.Getenv("MCP_CONFORMANCE"); f != "" {
		return f
	}
	for dir := testenv.RepoRoot(); ; dir = filepath.Dir(dir) {
		f := filepath.Join(dir, "shared", "tools", "mcp-conformance.cjs")
		if _, err := os.Stat(f); err == nil {
			return f
		}
		if filepath.Dir(dir) == dir {
			t.Skip("the MCP conformance suite's bundle (shared/tools/mcp-conformance.cjs beside the checkout, or $MCP_CONFORMANCE) is missing: it carries the TypeScript SDK's client")
		}
	}
}

// tsResult is what testdata/tssdk_client.cjs prints.
type tsResult struct {
	Error        string `json:"error"`
	NoSDK        string `json:"nosdk"`
	SDKLatest    string `json:"sdkLatest"`
	Negotiated   string `json:"negotiated"`
	Server       struct{ Name string }
	Instructions int
	Tools        []string
	Exec         struct {
		IsError    bool
		Structured map[string]any
		Text       string
	}
	Read struct {
		IsError bool
		Content string
		Text    string
	}
	Bad struct {
		IsError bool
		Text    string
	}
	Policy string
}

// TestTypeScriptSDKClient: the TypeScript SDK's client initializes at
// 2025-11-25, 2025-06-18, 2025-03-26 and 2024-11-05 over stdio and over HTTP, gets that version back, lists the tools, and runs commands and
// file tools whose structuredContent its own validation checks against
// each tool's outputSchema (it throws on a mismatch); a refused path is a
// tool error, and the policy resource reads.
func TestTypeScriptSDKClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the TypeScript SDK client needs Node.js 18 or later")
	}
	bundle := conformanceBundle(t)
	script := filepath.Join(testenv.RepoRoot(), "cmd", "sandbox-mcp", "testdata", "tssdk_client.cjs")
	h := startHTTP(t, httpOpts{})
	run := func(t *testing.T, version string, args ...string) {
		cmd := exec.Command(node, append([]string{script, bundle, version}, args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var r tsResult
		if jerr := json.Unmarshal(out, &r); jerr != nil {
			t.Fatalf("the client's output %q: %v (%v)\nstderr:\n%s", out, jerr, err, stderr.String())
		}
		if r.NoSDK != "" {
			t.Fatalf("%s: %s", bundle, r.NoSDK)
		}
		if r.Error != "" || err != nil {
			t.Fatalf("the TypeScript SDK client: %v %s\nstderr (the server's, over stdio):\n%s", err, r.Error, stderr.String())
		}
		if r.Negotiated != version || r.Server.Name != "sandbox-mcp" || r.Instructions == 0 {
			t.Errorf("initialize asking for %s (the SDK's own latest: %s): negotiated %q, server %q, instructions %d chars", version, r.SDKLatest, r.Negotiated, r.Server.Name, r.Instructions)
		}
		for _, want := range []string{"sandbox_exec", "sandbox_read_file", "sandbox_write_file", "sandbox_create"} {
			if !slices.Contains(r.Tools, want) {
				t.Errorf("tools/list lacks %s: %v", want, r.Tools)
			}
		}
		if version < "2025-06-18" {
			// Before structured content: the text carries it all.
			if r.Exec.IsError || r.Exec.Structured != nil || !strings.Contains(r.Exec.Text, "hi\n") || !strings.Contains(r.Exec.Text, "exit code 3") {
				t.Errorf("sandbox_exec: %+v", r.Exec)
			}
			if r.Read.IsError || !strings.Contains(r.Read.Text, "from ts\n") {
				t.Errorf("write then read: %+v", r.Read)
			}
		} else {
			if r.Exec.IsError || r.Exec.Structured["stdout"] != "hi\n" || r.Exec.Structured["exit_code"] != float64(3) {
				t.Errorf("sandbox_exec: %+v", r.Exec)
			}
			if r.Read.IsError || r.Read.Content != "from ts\n" {
				t.Errorf("write then read: %+v", r.Read)
			}
		}
		if !r.Bad.IsError || !strings.HasPrefix(r.Bad.Text, "OUTSIDE_WORKSPACE: ") {
			t.Errorf("a path out of the workspace: %+v", r.Bad)
		}
		if r.Policy != "sandbox://policy" {
			t.Errorf("resources/read sandbox://policy: %q", r.Policy)
		}
	}
	// On 2025-03-26 and 2024-11-05 results carry no structuredContent
	// and tools/list gives no outputSchema: this SDK's client refuses a
	// result without structured content from a tool that lists one.
	for _, v := range []string{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"} {
		t.Run("stdio/"+v, func(t *testing.T) {
			args := append([]string{"stdio", bins.Get(t).Server}, serverArgs(t)...)
			run(t, v, args...)
		})
		t.Run("http/"+v, func(t *testing.T) { run(t, v, "http", h.url) })
	}
}
