package tools

import (
	"context"

	"github.com/sandbox-mcp/sandbox-mcp/session"
	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

// handles is what sandbox_create, sandbox_status and sandbox_end ask of
// the registry of sandboxes (see session.Manager's methods of the same
// names): sandboxes by handle, owned by a caller, not by a session.
type handles interface {
	// Create makes a sandbox for owner that no session owns.
	Create(ctx context.Context, owner string, o session.CreateOptions) (session.SandboxInfo, error)
	// List returns owner's sandboxes, starting none.
	List(ctx context.Context, owner string) []session.SandboxInfo
	// End ends owner's sandbox id, saving its workspace first with
	// snapshotFirst.
	End(ctx context.Context, id, owner string, snapshotFirst bool) (*snapshot.Info, error)
}

func (m managerSandboxes) Create(ctx context.Context, owner string, o session.CreateOptions) (session.SandboxInfo, error) {
	sb, err := m.Manager.Create(ctx, owner, o)
	if err != nil {
		return session.SandboxInfo{}, err
	}
	return sb.Info(), nil
}

// passHandle is what a result tells the model about using a handle.
func passHandle(id string) string {
	return `pass "sandbox": "` + id + `" on later calls to work in it`
}
