package tools

import (
	"context"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestLongOutputTravelsOnce: an exec whose output is long carries it once,
// in the structured result, and its text says where it is and keeps the
// hint; a short one is in the text too; a client older than structured
// content gets the output in the text.
func TestLongOutputTravelsOnce(t *testing.T) {
	r := newRig(t, nil)
	res := r.call(NameExec, map[string]any{"argv": []string{"seq", "1", "20000"}})
	sc := res.StructuredContent.(map[string]any)
	stdout := sc["stdout"].(string)
	if !strings.HasSuffix(stdout, "19999\n20000\n") || sc["stdout_truncated"] != true || !strings.Contains(sc["hint"].(string), "stdout_offset") {
		t.Fatalf("structured: %d bytes, hint %q", len(stdout), sc["hint"])
	}
	txt := text(res)
	if strings.Contains(txt, "19999\n20000") || !strings.Contains(txt, "in the result's stdout") || !strings.Contains(txt, "stdout_offset") {
		t.Fatalf("the long output travels twice, or the text lacks where it is: %.300q", txt)
	}
	if txt := text(r.call(NameExec, map[string]any{"command": "echo short"})); !strings.Contains(txt, "short\n") {
		t.Fatalf("a short output is not in the text: %q", txt)
	}

	ctx := context.Background()
	old := connect(t, r.d, &mcp.ClientSessionOptions{ProtocolVersion: "2025-03-26"})
	res, err := old.CallTool(ctx, &mcp.CallToolParams{Name: NameExec, Arguments: map[string]any{"argv": []string{"seq", "1", "20000"}}})
	if err != nil || res.IsError || !strings.Contains(text(res), "19999\n20000\n") {
		t.Fatalf("an old client's exec: %v %.300q", err, text(res))
	}
	r.idle()
}
