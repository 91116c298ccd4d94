package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/sandbox-mcp/sandbox-mcp/image"
)

const imageUsage = `Usage: sandbox-mcp image

Prints the tag of the default sandbox image (the one make image builds and
--image defaults to), to build your own image on:

  docker build --build-arg BASE="$(sandbox-mcp image)" -t my-sandbox examples/toolchain
  sandbox-mcp --image my-sandbox

examples/toolchain/Dockerfile shows how; docs/image.md, "Your own toolchain", says
what such an image must keep.
`

// imageCmd prints the default image's tag on stdout, alone on its line, so
// that $(sandbox-mcp image) can be used in a build command.
func imageCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, imageUsage) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sandbox-mcp image: unexpected argument %q: it takes none (sandbox-mcp image -h)\n", fs.Arg(0))
		return 2
	}
	fmt.Fprintln(stdout, image.DefaultTag())
	return 0
}
