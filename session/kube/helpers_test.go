package kube

import (
	"strings"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func isUnavailable(err error) bool {
	e, ok := errcode.As(err)
	return ok && e.Code == errcode.Unavailable
}
