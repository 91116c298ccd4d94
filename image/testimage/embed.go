// Package testimage carries the build files of the small image used by tests
// and the tag they produce.
//
// The test image is Debian's static busybox in a FROM scratch image (about
// 2 MB, uid/gid 1000 "sandbox", /workspace, no setuid bits), built by build.sh
// with no registry and no network. Its tag is sandbox-mcp-test:<hash>, where
// <hash> is the first 12 hex digits of the SHA-256 of the Dockerfile's bytes
// followed by build.sh's bytes. Tag computes it from the copies embedded here;
// `build.sh --print-tag` computes it from the files on disk, and a test keeps
// the two in step.
package testimage

import (
	"embed"

	"github.com/sandbox-mcp/sandbox-mcp/image"
)

//go:embed Dockerfile build.sh
var files embed.FS

// Repository is the name part of Tag.
const Repository = "sandbox-mcp-test"

var tag = image.TagOf(Repository, files)

// Tag returns "sandbox-mcp-test:<hash>", the tag image/testimage/build.sh
// gives the test image built from the embedded Dockerfile and build.sh.
func Tag() string { return tag }
