package session

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// TestOversizedExecKeepsTheSandbox: no exec, however large or however
// its answer is sized, ends the agent's connection. A request the protocol
// cannot carry is TOO_LARGE; one that the old 64 KiB limit could not carry
// runs; an error whose message would not fit a frame still ends its call.
// After each, the workspace is the same.
func TestOversizedExecKeepsTheSandbox(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	ctx := context.Background()
	sh(t, sb, "echo kept > keep.txt")
	same := func(step string) {
		t.Helper()
		if res := run(t, sb, "cat", "keep.txt"); string(res.Stdout) != "kept\n" {
			t.Fatalf("after %s: keep.txt is %q", step, res.Stdout)
		}
	}

	// 1.2 MB once escaped: more than any request may be.
	_, err := sb.Exec(ctx, ExecRequest{Argv: []string{"echo", strings.Repeat("<", agentproto.MaxRequestHeader/6+1)}, Cwd: ".", Timeout: 10 * time.Second})
	wantCode(t, err, errcode.TooLarge)
	same("a request too large for the protocol")

	// 11.5 KB of '<' and a 66 KB env value: each past the old 64 KiB
	// header once escaped, and carried whole now.
	lt := strings.Repeat("<", 11500)
	res, err := sb.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", `printf %s "$1" | wc -c`, "sh", lt}, Cwd: ".", Timeout: 10 * time.Second, MaxOutput: 1 << 10})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "11500" {
		t.Fatalf("11.5 KB of '<' in argv: %q %v", res.Stdout, err)
	}
	res, err = sb.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", `printf %s "$BIG" | wc -c`}, Env: []string{"BIG=" + strings.Repeat("\x01", 66000)},
		Cwd: ".", Timeout: 10 * time.Second, MaxOutput: 1 << 10})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "66000" {
		t.Fatalf("a 66 KB env value: %q %v", res.Stdout, err)
	}
	same("large requests")

	// The agent quotes a program it cannot find: 70 KB of name would make
	// an error frame past its own limit.
	start := time.Now()
	_, err = sb.Exec(ctx, ExecRequest{Argv: []string{strings.Repeat("a", 70000)}, Cwd: ".", Timeout: time.Minute})
	if e := wantCode(t, err, errcode.NotFound); len(e.Message) > 8<<10 {
		t.Fatalf("the error is %d bytes", len(e.Message))
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("the error took %s", took)
	}
	same("an error too large for a frame")
}
