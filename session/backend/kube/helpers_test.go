package kube

import (
	"fmt"
	"strings"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func isUnavailable(err error) bool {
	e, ok := errcode.As(err)
	return ok && e.Code == errcode.Unavailable
}

func errorf(format string, a ...any) error { return fmt.Errorf(format, a...) }
