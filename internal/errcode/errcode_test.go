package errcode

import (
	"errors"
	"fmt"
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
