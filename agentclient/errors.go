package agentclient

import (
	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// maxAgentMessage bounds the text the server takes from an agent error.
const maxAgentMessage = 1024

// fromAgent turns an error frame body from the (untrusted) agent into an
// *errcode.Error, or an internal error for a code the agent may not send
// (see agentproto.Error.Err).
func fromAgent(e agentproto.Error) error {
	if len(e.Message) > maxAgentMessage {
		e.Message = e.Message[:maxAgentMessage] + "…"
	}
	return e.Err()
}
