// Package errcode is the one vocabulary of failures a caller can act on: the
// nine codes of the tool contract, and Error, a code with a sentence that says
// what was wrong and what to do instead.
//
// Every package returns an *Error when the failure is the model's to act on
// (a refused argument, a missing file, a limit reached, a sandbox gone), and
// a plain wrapped error otherwise. The tools show an *Error to the model as
// "CODE: message"; any other error is an internal fault, logged and never
// shown. The agent's protocol carries an *Error across the container
// boundary in its own wire form (package agentproto).
//
// The package is a leaf: it imports nothing of this module, so every package
// can use it.
package errcode

import (
	"errors"
	"fmt"
)

// Code classifies a failure the model can act on. A tool error's text starts
// with it.
type Code string

// The codes, in the order of the tool contract.
const (
	// InvalidArgument: an argument is malformed or names the wrong kind of
	// thing; the message says which and how to fix it.
	InvalidArgument Code = "INVALID_ARGUMENT"
	// PolicyDenied: the operator's policy refuses the call.
	PolicyDenied Code = "POLICY_DENIED"
	// ReadOnly: the call would change a read-only workspace.
	ReadOnly Code = "READ_ONLY"
	// OutsideWorkspace: a path leads outside the workspace.
	OutsideWorkspace Code = "OUTSIDE_WORKSPACE"
	// NotFound: the file, sandbox or snapshot named does not exist (or is
	// not the caller's).
	NotFound Code = "NOT_FOUND"
	// TooLarge: the call passes a size limit.
	TooLarge Code = "TOO_LARGE"
	// Timeout: the work did not finish in the time allowed.
	Timeout Code = "TIMEOUT"
	// Busy: a limit on concurrent work was reached; retrying later may work.
	Busy Code = "BUSY"
	// Unavailable: the engine or the sandbox is gone; the message says
	// whether retrying helps.
	Unavailable Code = "UNAVAILABLE"
)

// Codes returns every code, in the order of the tool contract. The slice is
// the caller's.
func Codes() []Code {
	return []Code{InvalidArgument, PolicyDenied, ReadOnly, OutsideWorkspace, NotFound, TooLarge, Timeout, Busy, Unavailable}
}

// Valid reports whether c is one of the codes.
func (c Code) Valid() bool {
	switch c {
	case InvalidArgument, PolicyDenied, ReadOnly, OutsideWorkspace, NotFound, TooLarge, Timeout, Busy, Unavailable:
		return true
	}
	return false
}

// Error is a failure the model can act on. Message is a sentence: what was
// wrong and, where possible, what to do instead.
type Error struct {
	Code    Code
	Message string

	// causes are the errors Errorf's %w verbs wrapped: errors.Is and
	// errors.As see them. They stay on this side of the agent's protocol,
	// which carries Code and Message only.
	causes []error
}

// Error renders e as a tool error's text: "CODE: message".
func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Errorf returns an *Error with the code and a formatted message. The
// arguments are formatted as by fmt.Errorf: an error given to a %w verb is
// rendered in the message and stays visible to errors.Is and errors.As
// (through Unwrap); one given to %v is only rendered.
func Errorf(code Code, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	e := &Error{Code: code, Message: err.Error()}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		e.causes = []error{u.Unwrap()}
	case interface{ Unwrap() []error }:
		e.causes = u.Unwrap()
	}
	return e
}

// Unwrap returns the errors Errorf wrapped with %w, if any.
func (e *Error) Unwrap() []error { return e.causes }

// As returns the first *Error in err's chain, if there is one.
func As(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}
