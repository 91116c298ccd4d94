// Package image carries the default sandbox image's build files and the tag
// they produce.
//
// The default image is a Debian bookworm toolbox (bash and the usual command
// line tools, git, curl, jq, ripgrep, python3 with pip and venv, Node.js with
// npm, gcc, g++ and make) built by build.sh without any image registry:
// debootstrap makes a rootfs from Debian's packages, apt installs the toolbox
// into it, and `docker import` turns it into the image with the Dockerfile's
// configuration. The tag is sandbox-mcp:<hash>, where <hash> is the first 12
// hex digits of the SHA-256 of the Dockerfile's bytes followed by build.sh's
// bytes, so it changes whenever either file does. DefaultTag computes it from
// the copies embedded here; `build.sh --print-tag` computes it from the files
// on disk, and a test keeps the two in step.
package image

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
)

//go:embed Dockerfile build.sh
var files embed.FS

// Repository is the name part of DefaultTag.
const Repository = "sandbox-mcp"

var defaultTag = TagOf(Repository, files)

// DefaultTag returns "sandbox-mcp:<hash>", the tag image/build.sh gives the
// default sandbox image built from the embedded Dockerfile and build.sh.
func DefaultTag() string { return defaultTag }

// TagOf returns "repo:<hash>" for an image directory's build files: the
// first 12 hex digits of sha256(Dockerfile bytes, then build.sh bytes), as
// `build.sh --print-tag` computes it. fsys holds both files.
func TagOf(repo string, fsys fs.FS) string {
	h := sha256.New()
	for _, name := range []string{"Dockerfile", "build.sh"} {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			panic("image: embedded " + name + ": " + err.Error()) // cannot happen: go:embed guarantees it
		}
		h.Write(b)
	}
	return repo + ":" + hex.EncodeToString(h.Sum(nil))[:12]
}
