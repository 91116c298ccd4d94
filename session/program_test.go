package session

import (
	"context"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// TestProgramIsOneAnswer: Program answers, in one call, what a command
// would run as and the container's resolved allowlist together: the shell
// of a command line, the path of a name, "" for a name the image lacks,
// and the allowlist without its entries the image lacks.
func TestProgramIsOneAnswer(t *testing.T) {
	m := testManager(t, func(o *Options) {
		o.Policy.Exec = policy.ExecAllowlist
		o.Policy.AllowCmds = []string{"sh", "cat", "no-such-program"}
	})
	sb := newSandbox(t, m)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	sh, err := sb.Program(ctx, "", ".", true)
	if err != nil || sh.Name != "sh" || sh.Path == "" {
		t.Fatalf("shell: %+v %v", sh, err)
	}
	if name, path, err := sb.Shell(ctx); name != sh.Name || path != sh.Path || err != nil {
		t.Errorf("Shell says %q %q (%v), Program %q %q", name, path, err, sh.Name, sh.Path)
	}
	if sh.Allowed[sh.Path] != "sh" || len(sh.Allowed) != 2 {
		t.Errorf("allowlist with the shell: %q, want sh and cat resolved", sh.Allowed)
	}
	cat, err := sb.Program(ctx, "cat", ".", false)
	if err != nil || cat.Name != "cat" || cat.Path == "" || cat.Allowed[cat.Path] != "cat" || len(cat.Allowed) != 2 {
		t.Errorf("cat: %+v %v", cat, err)
	}
	missing, err := sb.Program(ctx, "no-such-program", ".", false)
	if err != nil || missing.Path != "" || len(missing.Allowed) != 2 {
		t.Errorf("a program the image lacks: %+v %v", missing, err)
	}
}
