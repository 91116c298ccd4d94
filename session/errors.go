package session

import (
	"errors"
	"fmt"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
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
// *Error, or an internal error for a code the agent may not send (see
// agentproto.Error.Err).
func fromAgent(e agentproto.Error) error {
	if len(e.Message) > maxAgentMessage {
		e.Message = e.Message[:maxAgentMessage] + "…"
	}
	err := e.Err()
	if ce, ok := errcode.As(err); ok {
		return &Error{Code: policy.Code(ce.Code), Message: ce.Message}
	}
	return err
}
