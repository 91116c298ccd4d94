package tools

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// TestBadBase64KeepsItsCause: the refusal of content that is not base64
// is an INVALID_ARGUMENT whose cause, the decoder's error, errors.As finds.
func TestBadBase64KeepsItsCause(t *testing.T) {
	d := &Deps{Policy: policy.Default()}
	_, err := d.checkWrite(WriteIn{Path: "f", Content: "a$==", Encoding: "base64"})
	if e, ok := errcode.As(err); !ok || e.Code != errcode.InvalidArgument || !strings.Contains(e.Message, "illegal base64 data at input byte 1") {
		t.Fatalf("err %v, want INVALID_ARGUMENT naming the byte", err)
	}
	var corrupt base64.CorruptInputError
	if !errors.As(err, &corrupt) || corrupt != 1 {
		t.Errorf("errors.As finds no base64.CorruptInputError in %v", err)
	}
}
