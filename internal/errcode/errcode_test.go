package errcode

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"testing"
)

func TestCodesInContractOrder(t *testing.T) {
	want := []Code{"INVALID_ARGUMENT", "POLICY_DENIED", "READ_ONLY", "OUTSIDE_WORKSPACE", "NOT_FOUND",
		"TOO_LARGE", "TIMEOUT", "BUSY", "UNAVAILABLE"}
	if got := Codes(); !slices.Equal(got, want) {
		t.Fatalf("Codes() = %v, want %v", got, want)
	}
	for _, c := range Codes() {
		if !c.Valid() {
			t.Errorf("%s is not Valid", c)
		}
	}
	Codes()[0] = "CHANGED"
	if Codes()[0] != InvalidArgument {
		t.Error("changing the slice Codes returned changed the next one")
	}
}

func TestUnknownCodesAreNotValid(t *testing.T) {
	for _, c := range []Code{"", "INTERNAL", "invalid_argument", "NOT_FOUND ", "OK"} {
		if c.Valid() {
			t.Errorf("%q is Valid", c)
		}
	}
}

func TestErrorReadsCodeColonMessage(t *testing.T) {
	e := Errorf(NotFound, "%q is missing; list the directory", "a/b")
	if got, want := e.Error(), `NOT_FOUND: "a/b" is missing; list the directory`; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

func TestAsFindsTheErrorThroughWrapping(t *testing.T) {
	inner := Errorf(Busy, "too many")
	e, ok := As(fmt.Errorf("session: exec: %w", inner))
	if !ok || e != inner {
		t.Fatalf("As(wrapped) = %v, %v; want the inner *Error", e, ok)
	}
	e, ok = As(errors.Join(errors.New("other"), inner))
	if !ok || e != inner {
		t.Fatalf("As(joined) = %v, %v; want the inner *Error", e, ok)
	}
}

func TestAsRefusesOtherErrors(t *testing.T) {
	for _, err := range []error{
		nil,
		errors.New("BUSY: looks like one, but is text"),
		fmt.Errorf("rendered, not wrapped: %v", Errorf(Busy, "x")),
	} {
		if e, ok := As(err); ok || e != nil {
			t.Errorf("As(%v) = %v, %v; want nothing", err, e, ok)
		}
	}
}

// TestErrorfKeepsItsCause: an error given to %w stays visible to errors.Is
// and errors.As through the *Error, and reads in the message as with
// fmt.Errorf; one given to %v is rendered only.
func TestErrorfKeepsItsCause(t *testing.T) {
	pathErr := &fs.PathError{Op: "open", Path: "a/b", Err: fs.ErrNotExist}
	e := Errorf(NotFound, "read %q: %w", "a/b", pathErr)
	if got, want := e.Error(), `NOT_FOUND: read "a/b": open a/b: file does not exist`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(e, fs.ErrNotExist) {
		t.Error("errors.Is(e, fs.ErrNotExist) = false: the cause given to %w is hidden")
	}
	var pe *fs.PathError
	if !errors.As(e, &pe) || pe != pathErr {
		t.Errorf("errors.As(e, *fs.PathError) = %v", pe)
	}
	if got, ok := As(fmt.Errorf("outer: %w", e)); !ok || got != e {
		t.Errorf("As(wrapped) = %v, %v; want e itself", got, ok)
	}

	two := Errorf(Timeout, "%w after %w", context.DeadlineExceeded, pathErr)
	if !errors.Is(two, context.DeadlineExceeded) || !errors.Is(two, fs.ErrNotExist) {
		t.Errorf("%v: both causes given to %%w should be visible", two)
	}

	rendered := Errorf(NotFound, "read: %v", pathErr)
	if errors.Is(rendered, fs.ErrNotExist) || rendered.Unwrap() != nil {
		t.Errorf("%v: an error given to %%v was wrapped", rendered)
	}
}
