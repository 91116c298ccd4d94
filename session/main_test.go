package session

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// bins is the agent built for this test run, on first use: a run whose
// tests all skip (-short) builds nothing.
var bins testenv.LazyBinaries

// intruder is the static program the security tests run inside sandboxes
// as hostile code, built on first use like bins.
var intruder struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// intruderBin returns the intruder program, building it on the first call;
// a failed build fails every test that asks.
func intruderBin(t testing.TB) string {
	t.Helper()
	intruder.once.Do(func() {
		intruder.dir, intruder.err = os.MkdirTemp("", "sandbox-mcp-intruder-")
		if intruder.err != nil {
			return
		}
		intruder.path = filepath.Join(intruder.dir, "intruder")
		build := exec.Command("go", "build", "-trimpath", "-o", intruder.path, "./session/internal/intruder")
		build.Dir = testenv.RepoRoot()
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			intruder.err = fmt.Errorf("build the intruder: %v\n%s", err, out)
		}
	})
	if intruder.err != nil {
		t.Fatal(intruder.err)
	}
	return intruder.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	bins.Cleanup()
	if intruder.dir != "" {
		os.RemoveAll(intruder.dir)
	}
	os.Exit(code)
}

// testManager starts a Manager on the real engine with the busybox test
// image and a unique instance id; every container it made must be gone when
// the test ends.
func testManager(t *testing.T, edit func(*Options)) *Manager {
	t.Helper()
	return testDockerManager(t, edit, nil)
}

// testDocker is the Docker backend for a test manager with opts, as main
// builds it for the server: the test image and the agent built for this
// run; editDocker, if set, changes its configuration.
func testDocker(t *testing.T, opts Options, editDocker func(*docker.Config)) *docker.Docker {
	t.Helper()
	uid, gid := opts.UID, opts.GID
	if uid == 0 {
		uid, gid = DefaultUID, DefaultUID
	}
	instance := opts.Instance
	if instance == "" {
		instance = "test-" + randomID("")[:6]
	}
	cfg := docker.Config{
		Client:      testenv.Engine(t),
		Image:       testenv.TestImage(t),
		AgentBinary: bins.Get(t).Agent,
		AgentDir:    filepath.Join(opts.StateDir, "agents"),
		UID:         uid,
		GID:         gid,
		Instance:    instance,
		Egress:      opts.Policy.Network == policy.NetworkAllowlist,
		Logger:      opts.Logger,
	}
	if editDocker != nil {
		editDocker(&cfg)
	}
	d, err := docker.New(cfg)
	if err != nil {
		t.Fatalf("docker.New: %v", err)
	}
	return d
}

// testDockerManager is testManager with the Docker backend's configuration
// changed by editDocker.
func testDockerManager(t *testing.T, edit func(*Options), editDocker func(*docker.Config)) *Manager {
	t.Helper()
	cli := testenv.Engine(t)
	instance := "test-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(instance) > 60 {
		instance = instance[:60]
	}
	instance += "-" + randomID("")[:6]
	opts := Options{
		Policy:   policy.Default(),
		StateDir: t.TempDir(),
		Instance: instance,
		Logger:   testLogger(t),
	}
	opts.Policy.Memory = 256 << 20
	opts.Policy.MaxWorkspaceBytes = 64 << 20
	if edit != nil {
		edit(&opts)
	}
	if opts.Backend == nil {
		opts.Backend = testDocker(t, opts, editDocker)
	}
	m, err := NewManager(context.Background(), opts)
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := m.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		left := testenv.Containers(t, cli, docker.LabelInstance, instance)
		testenv.RemoveLabelled(cli, docker.LabelInstance, instance)
		if len(left) > 0 {
			t.Errorf("containers left behind after Close: %v", left)
		}
		nets, err := cli.NetworkList(ctx, client.NetworkListOptions{Filters: make(client.Filters).Add("label", docker.LabelInstance+"="+instance)})
		if err != nil {
			t.Errorf("list networks: %v", err)
		}
		for _, n := range nets.Items {
			t.Errorf("network left behind after Close: %s", n.Name)
			cli.NetworkRemove(ctx, n.ID, client.NetworkRemoveOptions{})
		}
	})
	return m
}

// testLogger logs to the test log while the test runs, and drops what
// background goroutines log after it ended.
func testLogger(t *testing.T) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct {
	t    *testing.T
	mu   sync.Mutex
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// run executes argv in sb and fails the test if it cannot run.
func run(t *testing.T, sb *Sandbox, argv ...string) ExecResult {
	t.Helper()
	res, err := sb.Exec(context.Background(), ExecRequest{Argv: argv, Cwd: ".", Timeout: 30 * time.Second, MaxOutput: 1 << 20})
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	return res
}

// sh runs a shell script in sb.
func sh(t *testing.T, sb *Sandbox, script string) ExecResult {
	t.Helper()
	return run(t, sb, "sh", "-c", script)
}

// isGone reports an engine error that means the object no longer exists.
func isGone(err error) bool { return cerrdefs.IsNotFound(err) }
