package tools

import (
	"context"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestTextCarriesTheOutput: an exec whose output is long carries it in
// the text as in the structured result (each kind of client shows the
// model one of them), hint included; a client that negotiated a version
// older than structured content gets the text alone, and so does one
// that asked for a version the server does not serve only when that
// version is what was negotiated.
func TestTextCarriesTheOutput(t *testing.T) {
	r := newRig(t, nil)
	res := r.call(NameExec, map[string]any{"argv": []string{"seq", "1", "20000"}})
	sc := res.StructuredContent.(map[string]any)
	stdout := sc["stdout"].(string)
	if !strings.HasSuffix(stdout, "19999\n20000\n") || sc["stdout_truncated"] != true || !strings.Contains(sc["hint"].(string), "stdout_offset") {
		t.Fatalf("structured: %d bytes, hint %q", len(stdout), sc["hint"])
	}
	txt := text(res)
	if !strings.Contains(txt, stdout) || strings.Contains(txt, "in the result's stdout") || !strings.Contains(txt, "stdout_offset") {
		t.Fatalf("the text lacks the output or the hint: %.300q", txt)
	}

	ctx := context.Background()
	old := connect(t, r.d, &mcp.ClientSessionOptions{ProtocolVersion: "2025-03-26"})
	res, err := old.CallTool(ctx, &mcp.CallToolParams{Name: NameExec, Arguments: map[string]any{"argv": []string{"seq", "1", "20000"}}})
	if err != nil || res.IsError || !strings.Contains(text(res), "19999\n20000\n") || res.StructuredContent != nil {
		t.Fatalf("an old client's exec: %v %.300q, structured %T", err, text(res), res.StructuredContent)
	}
	// 2024-10-07 is no version the server serves: it negotiates its
	// latest, which has structured content.
	odd := connect(t, r.d, &mcp.ClientSessionOptions{ProtocolVersion: "2024-10-07"})
	if v := odd.InitializeResult().ProtocolVersion; v < "2025-06-18" {
		t.Fatalf("negotiated %s", v)
	}
	res, err = odd.CallTool(ctx, &mcp.CallToolParams{Name: NameExec, Arguments: map[string]any{"argv": []string{"echo", "hi"}}})
	if err != nil || res.StructuredContent == nil || !strings.Contains(text(res), "hi\n") {
		t.Fatalf("a client that negotiated a newer version: %v %q, structured %v", err, text(res), res.StructuredContent)
	}
	r.idle()
}
