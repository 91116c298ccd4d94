package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/image"
)

func TestImageCommand(t *testing.T) {
	env := envFrom(map[string]string{"HOME": t.TempDir()})
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"image"}, nil, &stdout, &stderr, env); code != 0 || stdout.String() != image.DefaultTag()+"\n" || stderr.Len() != 0 {
		t.Fatalf("sandbox-mcp image: exit %d, stdout %q, stderr %q; want the default tag alone", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	if code := run(context.Background(), []string{"image", "extra"}, nil, &stdout, &stderr, env); code != 2 || stdout.Len() != 0 ||
		!strings.Contains(stderr.String(), `unexpected argument "extra"`) {
		t.Fatalf("sandbox-mcp image extra: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
	stderr.Reset()
	if code := run(context.Background(), []string{"image", "-h"}, nil, &stdout, &stderr, env); code != 0 ||
		!strings.Contains(stderr.String(), `--build-arg BASE="$(sandbox-mcp image)"`) {
		t.Fatalf("sandbox-mcp image -h: exit %d, stderr %q", code, stderr.String())
	}
	stdout.Reset()
	run(context.Background(), []string{"help"}, nil, &stdout, &stderr, env)
	if !strings.Contains(stdout.String(), "sandbox-mcp image ") {
		t.Fatalf("the usage does not list the image command:\n%s", stdout.String())
	}
}
