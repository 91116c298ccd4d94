package policy

import (
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// TestConstantsAgreeWithTheWire: policy keeps its own copy of the two facts
// it shares with the agent's protocol, so that it imports no wire package;
// the copies must agree, or the server would check paths against one
// workspace and the agent serve another.
func TestConstantsAgreeWithTheWire(t *testing.T) {
	if Workspace != agentproto.Workspace {
		t.Errorf("policy.Workspace = %q, agentproto.Workspace = %q", Workspace, agentproto.Workspace)
	}
	if MaxEdits != agentproto.MaxEdits {
		t.Errorf("policy.MaxEdits = %d, agentproto.MaxEdits = %d", MaxEdits, agentproto.MaxEdits)
	}
}
