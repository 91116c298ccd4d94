// Package testenv gives integration and end-to-end tests what they need from
// the machine: the real Docker engine, the sandbox images (built offline),
// freshly built binaries, and a check that nothing was left on the engine.
//
// Nothing here fakes the engine: tests that use it run against the real one.
// Every such test goes through NeedsDocker (Engine, TestImage and
// DefaultImage call it): under `go test -short` it skips, saying why, so the
// rest of the suite runs on a machine without Docker; without -short (make
// test) it fails when the engine is missing, with what to do about it.
package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/image"
	"github.com/sandbox-mcp/sandbox-mcp/image/testimage"
)

// RepoRoot returns the repository's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

var (
	engineOnce sync.Once
	engineErr  error
)

// NeedsDocker marks a test that uses the Docker engine, directly or through
// a server it starts. Under -short it skips the test, saying so. Otherwise
// it fails the test at once if the engine does not answer (asked once per
// test binary, for at most 10 s), saying what to do.
func NeedsDocker(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("uses the Docker engine; -short runs only the tests that do not (make test runs them all)")
	}
	engineOnce.Do(func() {
		cli, err := client.New(client.FromEnv)
		if err != nil {
			engineErr = err
			return
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, engineErr = cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
	})
	if engineErr != nil {
		t.Fatalf("this test needs a running Docker engine (%v): start it, or set DOCKER_HOST; `go test -short` skips the tests that need it", engineErr)
	}
}

// Engine returns a client of the real Docker engine (see NeedsDocker),
// its API version negotiated with the engine.
func Engine(t testing.TB) *client.Client {
	t.Helper()
	NeedsDocker(t)
	cli, err := client.New(client.FromEnv)
	if err != nil {
		t.Fatalf("docker client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		cli.Close()
		t.Fatalf("this test needs a running Docker engine (%v): start it, or set DOCKER_HOST", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

var (
	testImageOnce sync.Once
	testImageErr  error
)

// TestImage returns the small busybox test image, building it (offline,
// from Debian's busybox-static) if it is missing.
func TestImage(t testing.TB) string {
	t.Helper()
	NeedsDocker(t)
	tag := testimage.Tag()
	testImageOnce.Do(func() {
		if imageExists(tag) {
			return
		}
		out, err := exec.Command("bash", filepath.Join(RepoRoot(), "image", "testimage", "build.sh")).CombinedOutput()
		if err != nil {
			testImageErr = fmt.Errorf("build %s: %v\n%s", tag, err, out)
		}
	})
	if testImageErr != nil {
		t.Fatalf("%v (it needs busybox-static: apt-get install busybox-static)", testImageErr)
	}
	return tag
}

// DefaultImage returns the default sandbox image, which must have been built
// (`make image`; it takes a couple of minutes, so tests do not build it).
func DefaultImage(t testing.TB) string {
	t.Helper()
	NeedsDocker(t)
	tag := image.DefaultTag()
	if !imageExists(tag) {
		t.Fatalf("the default image %s is missing: run `make image` first (make test does)", tag)
	}
	return tag
}

func imageExists(tag string) bool {
	return exec.Command("docker", "image", "inspect", tag).Run() == nil
}

// Binaries are the programs built for a test run.
type Binaries struct {
	Dir    string // holds both
	Server string // sandbox-mcp
	Agent  string // sandbox-agent (static)
}

// Build builds the agent (static, as it runs in any image) and, if server
// is true, the server into dir. With race set the server is built with the
// race detector, so end-to-end tests check the real binary for races too.
func Build(dir string, server, race bool) (Binaries, error) {
	b := Binaries{Dir: dir, Server: filepath.Join(dir, "sandbox-mcp"), Agent: filepath.Join(dir, "sandbox-agent")}
	// -trimpath makes the agent the same bytes from any checkout, so test
	// runs share one runtime image instead of adding one each.
	agent := exec.Command("go", "build", "-trimpath", "-o", b.Agent, "./cmd/sandbox-agent")
	agent.Dir = RepoRoot()
	agent.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := agent.CombinedOutput(); err != nil {
		return b, fmt.Errorf("build agent: %v\n%s", err, out)
	}
	if !server {
		return b, nil
	}
	args := []string{"build", "-o", b.Server}
	if race {
		args = append(args, "-race")
	}
	srv := exec.Command("go", append(args, "./cmd/sandbox-mcp")...)
	srv.Dir = RepoRoot()
	if out, err := srv.CombinedOutput(); err != nil {
		return b, fmt.Errorf("build server: %v\n%s", err, out)
	}
	return b, nil
}

// Containers lists the containers (running or not) that carry label=value.
func Containers(t testing.TB, cli *client.Client, label, value string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", label+"="+value)})
	if err != nil {
		t.Fatalf("list containers: %v", err)
	}
	var ids []string
	for _, c := range res.Items {
		ids = append(ids, c.ID[:12]+" "+string(c.State)+" "+strings.Join(c.Names, ","))
	}
	return ids
}

// WaitNoContainers waits until no container carries label=value, and fails
// the test if some remain after timeout.
func WaitNoContainers(t testing.TB, cli *client.Client, label, value string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left := Containers(t, cli, label, value)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("containers left behind with %s=%s: %v", label, value, left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// RemoveLabelled force-removes every container carrying label=value; tests
// use it in t.Cleanup so a failing test leaves nothing behind either.
func RemoveLabelled(cli *client.Client, label, value string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", label+"="+value)})
	if err != nil {
		return
	}
	for _, c := range res.Items {
		_, err := cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
		if err != nil && !cerrdefs.IsNotFound(err) && !cerrdefs.IsConflict(err) {
			fmt.Fprintf(os.Stderr, "testenv: remove %s: %v\n", c.ID, err)
		}
	}
}

var (
	serverImageOnce sync.Once
	serverImageTag  string
	serverImageErr  error
)

// ServerImage returns the image of the server itself (image/server),
// building the static server and agent into a temporary directory and the
// image from them, once per test binary. The image is tagged by the
// binaries' digest, so a rebuilt binary gives a new tag and an unchanged one
// reuses the image; tests do not remove it (`docker image prune` or
// `docker rmi` do).
func ServerImage(t testing.TB) string {
	t.Helper()
	NeedsDocker(t)
	serverImageOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sandbox-mcp-server-bin-")
		if err != nil {
			serverImageErr = err
			return
		}
		defer os.RemoveAll(dir)
		for _, c := range []string{"sandbox-mcp", "sandbox-agent"} {
			cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(dir, c), "./cmd/"+c)
			cmd.Dir = RepoRoot()
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				serverImageErr = fmt.Errorf("build %s (static): %v\n%s", c, err, out)
				return
			}
		}
		cmd := exec.Command("bash", filepath.Join(RepoRoot(), "image", "server", "build.sh"), dir)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			serverImageErr = fmt.Errorf("image/server/build.sh: %v\n%s", err, stderr.String())
			return
		}
		lines := strings.Fields(string(out))
		if len(lines) == 0 {
			serverImageErr = fmt.Errorf("image/server/build.sh printed no tag\n%s", stderr.String())
			return
		}
		serverImageTag = lines[len(lines)-1]
	})
	if serverImageErr != nil {
		t.Fatal(serverImageErr)
	}
	return serverImageTag
}

// LazyBinaries are Binaries built on first use rather than in TestMain, so
// that a run whose tests all skip (`go test -short` of end-to-end tests)
// builds nothing. Each test that needs them calls Get; the build happens
// once per test binary, and Cleanup (from TestMain, after m.Run) removes it.
type LazyBinaries struct {
	WithServer bool // build the server too, not only the agent
	Race       bool // build the server with the race detector

	once sync.Once
	dir  string
	b    Binaries
	err  error
}

// Get returns the binaries, building them on the first call; a failed build
// fails every test that asks.
func (l *LazyBinaries) Get(t testing.TB) Binaries {
	t.Helper()
	l.once.Do(func() {
		l.dir, l.err = os.MkdirTemp("", "sandbox-mcp-bin-")
		if l.err == nil {
			l.b, l.err = Build(l.dir, l.WithServer, l.Race)
		}
	})
	if l.err != nil {
		t.Fatal(l.err)
	}
	return l.b
}

// Cleanup removes what Get built, if anything.
func (l *LazyBinaries) Cleanup() {
	if l.dir != "" {
		os.RemoveAll(l.dir)
	}
}
