// Package image carries the default sandbox image's build files and the tag
// they produce.
//
// The default image is Debian bookworm (bash, coreutils, python3, git, curl,
// ca-certificates, tar, procps) built by build.sh without any image registry:
// debootstrap makes a rootfs from Debian's packages, `docker import` turns it
// into a base image, and `docker build` applies the Dockerfile on top. The tag
// is sandbox-mcp:<hash>, where <hash> is the first 12 hex digits of the SHA-256
// of the Dockerfile's bytes followed by build.sh's bytes, so it changes
// whenever either file does. DefaultTag computes it from the copies embedded
// here; `build.sh --print-tag` computes it from the files on disk, and a test
// keeps the two in step.
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
