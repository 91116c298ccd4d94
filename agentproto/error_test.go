package agentproto

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// overTheWire sends e as the body of an error frame and decodes it again, as
// the agent and the server do.
func overTheWire(t *testing.T, e Error) Error {
	t.Helper()
	var buf bytes.Buffer
	if err := NewWriter(&buf).Write(3, KindError, e, nil); err != nil {
		t.Fatal(err)
	}
	f, err := NewReader(&buf).Read()
	if err != nil {
		t.Fatal(err)
	}
	var got Error
	if err := f.Decode(&got); err != nil {
		t.Fatal(err)
	}
	return got
}

func TestEveryCodeCrossesTheWire(t *testing.T) {
	for _, code := range errcode.Codes() {
		msg := fmt.Sprintf("%s happened to \"a/b\"; do something else", code)
		wire := overTheWire(t, ErrorOf(fmt.Errorf("workspace: %w", errcode.Errorf(code, "%s", msg))))
		if wire.Code != string(code) || wire.Message != msg {
			t.Errorf("%s: the wire carried %+v", code, wire)
			continue
		}
		e, ok := errcode.As(wire.Err())
		if code == errcode.PolicyDenied {
			// Only the server's policy decides; the agent cannot claim it.
			if ok {
				t.Errorf("the agent's %s came back as %v, a model-facing error", code, e)
			}
			continue
		}
		if !ok || e.Code != code || e.Message != msg {
			t.Errorf("%s: Err() = %v, want the same code and message", code, wire.Err())
		}
	}
}

func TestFaultsCrossTheWireAsInternal(t *testing.T) {
	wire := overTheWire(t, ErrorOf(errors.New("close workspace: EIO")))
	if wire.Code != CodeInternal || wire.Message != "close workspace: EIO" {
		t.Fatalf("a fault went on the wire as %+v, want INTERNAL with its text", wire)
	}
	if _, ok := errcode.As(wire.Err()); ok {
		t.Fatalf("INTERNAL came back as a model-facing error: %v", wire.Err())
	}
}

func TestUnknownWireCodesAreInternal(t *testing.T) {
	for _, code := range []string{CodeInternal, "", "ROOT", "not_found", "NOT_FOUND ", string(errcode.PolicyDenied)} {
		err := overTheWire(t, Error{Code: code, Message: "trust me"}).Err()
		if err == nil {
			t.Errorf("code %q: Err() is nil", code)
			continue
		}
		if e, ok := errcode.As(err); ok {
			t.Errorf("code %q came back as %v, a model-facing error", code, e)
		}
		if !strings.Contains(err.Error(), "agent: "+code+": trust me") {
			t.Errorf("code %q: %q does not say what the agent sent", code, err)
		}
	}
}
