package session

import (
	"errors"
	"fmt"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// Error is a failure the model can act on. Its Code is one of the tool
// contract's codes; Message says what was wrong and what to do.
type Error struct {
	Code    policy.Code
	Message string
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

func errorf(code policy.Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// AsError returns err's *Error, if it holds one.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

// maxAgentMessage bounds the text the server takes from an agent error.
const maxAgentMessage = 1024

// fromAgent turns an error frame body from the (untrusted) agent into an
// *Error, or an internal error for a code outside the contract.
func fromAgent(e agentproto.Error) error {
	msg := e.Message
	if len(msg) > maxAgentMessage {
		msg = msg[:maxAgentMessage] + "…"
	}
	if !e.Code.Valid() || e.Code == agentproto.CodeInternal {
		return fmt.Errorf("agent: %s: %s", e.Code, msg)
	}
	return &Error{Code: policy.Code(e.Code), Message: msg}
}
