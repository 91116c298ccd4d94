package policy

import (
	"strings"
	"unicode"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// MaxExposePath is the longest path sandbox_expose takes.
const MaxExposePath = 1024

// MaxPortWait is the longest wait_ms sandbox_expose takes.
const MaxPortWait = 60_000

// CheckExpose validates sandbox_expose's arguments: a TCP port, a wait
// within 0..MaxPortWait, and a URL path without control characters, "..",
// a scheme or a host.
func CheckExpose(port int, path string, waitMS int64) Decision {
	if port < 1 || port > 65535 {
		return Deny(errcode.InvalidArgument, "port is %d; give the TCP port the server listens on inside the sandbox, 1 to 65535", port)
	}
	if waitMS < 0 || waitMS > MaxPortWait {
		return Deny(errcode.InvalidArgument, "wait_ms is %d; give 0 to %d (milliseconds to wait for something to listen)", waitMS, MaxPortWait)
	}
	if len(path) > MaxExposePath {
		return Deny(errcode.InvalidArgument, "path is %d bytes; give at most %d", len(path), MaxExposePath)
	}
	if strings.ContainsFunc(path, func(r rune) bool { return unicode.IsControl(r) || r == '\\' || r == ' ' }) ||
		strings.Contains(path, "://") || strings.HasPrefix(path, "//") || strings.Contains(path, "..") {
		return Deny(errcode.InvalidArgument, "path %q is not a plain URL path under the port's root (e.g. \"docs/index.html\" or \"/app?x=1\")", path)
	}
	return Allowed
}
