package main

// The first start after a build: the server answers its client at once,
// whatever it must prepare first (an image with an agent the engine has
// never seen, a read-only workspace's seed image), and the first tool call
// waits for that with progress notifications.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/moby/moby/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// answerWithin is how soon after the process starts a client must have its
// answers to initialize, tools/list, resources/list and ping, on an idle
// machine; answerBound adds what the machine's load adds.
const answerWithin = 2 * time.Second

// answerBound is answerWithin plus four times what starting the same
// binary to print its version takes right now: on a loaded machine
// (the test run's other packages, a Kubernetes node) a process start
// alone took over a second, and the bound is about waiting for nothing
// (the engine, the cluster), not about the machine's speed.
func answerBound(t *testing.T, server string) time.Duration {
	t.Helper()
	start := time.Now()
	if out, err := exec.Command(server, "--version").CombinedOutput(); err != nil {
		t.Fatalf("%s --version: %v\n%s", server, err, out)
	}
	return answerWithin + 4*time.Since(start)
}

// newAgent builds the agent with a version string of its own: bytes no
// engine has seen, as after a rebuild that changed it.
func newAgent(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sandbox-agent")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags",
		"-X github.com/sandbox-mcp/sandbox-mcp/agent.version=first-start-"+randomHex(8), "-o", path, "./cmd/sandbox-agent")
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v\n%s", err, out)
	}
	return path
}

// newSeed makes a --workspace-from directory no engine has seen: a README
// to read back and 24 MiB of random bytes, so that its image takes a few
// seconds to build even on an idle engine.
func newSeed(t *testing.T) (dir, readme string) {
	t.Helper()
	dir = t.TempDir()
	readme = "seed " + randomHex(8) + "\n"
	big := make([]byte, 24<<20)
	rand.Read(big)
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte(readme), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, readme
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

var builtImage = regexp.MustCompile(`runtime_image=(sandbox-mcp-runtime:[0-9a-f]+)`)

// removeBuiltImages removes the runtime images a server logged it runs:
// each of these tests makes new ones.
func removeBuiltImages(cli *client.Client, logs string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, m := range builtImage.FindAllStringSubmatch(logs, -1) {
		cli.ImageRemove(ctx, m[1], client.ImageRemoveOptions{Force: true, PruneChildren: true})
	}
}

// firstStartArgs are the server's flags for one first-start path.
func firstStartArgs(t *testing.T, agentMount string, seed bool) (args []string, readme string) {
	args = append(serverArgs(t), "--agent-bin", newAgent(t), "--agent-mount", agentMount)
	if seed {
		dir, r := newSeed(t)
		args = append(args, "--read-only", "--workspace-from", dir)
		readme = r
	}
	return args, readme
}

// firstStartPaths are the paths of a first start: the agent bind-mounted
// and a new seed to bake into an image; the agent in an image built for
// it.
var firstStartPaths = []struct {
	name       string
	agentMount string
	seed       bool
}{
	{"bind-mounted agent, new read-only seed", docker.AgentMountBind, true},
	{"agent in a new image", docker.AgentMountImage, false},
}

// TestFirstStartAnswersAtOnce: through the go-sdk client, the built server
// started with an agent the engine has never seen (and a new seed) answers
// initialize, tools/list, resources/list and ping within answerWithin of
// its start; the first tool call hears what is being prepared, and why,
// in progress notifications, then runs (calling again, as the error says,
// if the preparation outlasts the call's budget); the log says what was
// prepared and why.
func TestFirstStartAnswersAtOnce(t *testing.T) {
	cli := testenv.Engine(t)
	for _, path := range firstStartPaths {
		t.Run(path.name, func(t *testing.T) {
			args, readme := firstStartArgs(t, path.agentMount, path.seed)
			stderr := &syncBuffer{}
			cmd := exec.Command(bins.Get(t).Server, args...)
			cmd.Env = serverEnv(t)
			cmd.Stderr = stderr
			var mu sync.Mutex
			var progress []string
			c := mcp.NewClient(&mcp.Implementation{Name: "first-start", Version: "0"}, &mcp.ClientOptions{
				ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
					mu.Lock()
					progress = append(progress, r.Params.Message)
					mu.Unlock()
				}})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			bound := answerBound(t, bins.Get(t).Server)
			start := time.Now()
			cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 20 * time.Second}, nil)
			if err != nil {
				t.Fatalf("connect: %v\n%s", err, stderr)
			}
			var sandbox string
			t.Cleanup(func() {
				cs.Close()
				if sandbox != "" {
					testenv.WaitNoContainers(t, cli, docker.LabelSandbox, sandbox, 30*time.Second)
				}
				removeBuiltImages(cli, stderr.String())
				if t.Failed() {
					t.Logf("server stderr:\n%s", stderr)
				}
			})
			initialized := time.Since(start)
			if _, err := cs.ListTools(ctx, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := cs.ListResources(ctx, nil); err != nil {
				t.Fatal(err)
			}
			if err := cs.Ping(ctx, nil); err != nil {
				t.Fatal(err)
			}
			answered := time.Since(start)
			t.Logf("initialize answered %s after the start, tools/list, resources/list and ping %s", initialized.Round(time.Millisecond), answered.Round(time.Millisecond))
			if answered > bound {
				t.Fatalf("answered %s after the start, want within %s (%s and what the load adds to a process start)", answered, bound, answerWithin)
			}

			argv := []string{"cat", "README"}
			if readme == "" {
				argv, readme = []string{"echo", "ran"}, "ran\n"
			}
			var res *mcp.CallToolResult
			for try := 1; ; try++ {
				res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_exec", Meta: mcp.Meta{"progressToken": fmt.Sprintf("first-%d", try)},
					Arguments: map[string]any{"argv": argv}})
				if err != nil {
					t.Fatal(err)
				}
				if !res.IsError || try == 5 || !strings.HasPrefix(text(res), "UNAVAILABLE: sandboxes are not ready yet") || !strings.Contains(text(res), "Call again") {
					break
				}
				t.Logf("call %d: %s", try, text(res))
			}
			if res.IsError {
				t.Fatalf("the first call: %s", text(res))
			}
			out, _ := res.StructuredContent.(map[string]any)
			if out["stdout"] != readme {
				t.Fatalf("the first call's output: %v", out)
			}
			sandbox, _ = out["sandbox"].(string)
			mu.Lock()
			got := append([]string(nil), progress...)
			mu.Unlock()
			wantWhy := "the --workspace-from content is new to this engine"
			if !path.seed {
				// Or, on an engine that never had a runtime image of
				// this base, "it is the first start with".
				wantWhy = "the agent changed since the last start"
				if !strings.Contains(stderr.String(), wantWhy) {
					wantWhy = "it is the first start with"
				}
			}
			all := strings.Join(got, "\n")
			if !strings.HasPrefix(all, "sandbox-mcp: ") || !strings.Contains(all, "sandbox-mcp: building the ") || !strings.Contains(all, wantWhy) {
				t.Fatalf("progress of the first call: %q, want what is prepared and why (%q)", got, wantWhy)
			}
			logs := stderr.String()
			for _, want := range []string{"preparing sandboxes in the background", wantWhy, "sandboxes prepared"} {
				if !strings.Contains(logs, want) {
					t.Errorf("the log does not say %q", want)
				}
			}
		})
	}
}

// TestFirstStartMCPGo: the same through mcp-go with its default timeouts
// (its stdio client waits for nothing longer than the caller's context,
// which has no deadline here): initialize and the listings come within
// answerWithin, and the first call's progress notifications say what is
// prepared.
func TestFirstStartMCPGo(t *testing.T) {
	cli := testenv.Engine(t)
	args, readme := firstStartArgs(t, docker.AgentMountBind, true)
	logs := &syncBuffer{}
	bound := answerBound(t, bins.Get(t).Server)
	start := time.Now()
	c, err := mcpclient.NewStdioMCPClientWithOptions(bins.Get(t).Server, serverEnv(t), args, transport.WithCommandStderrWriter(logs))
	if err != nil {
		t.Fatal(err)
	}
	var sandbox string
	t.Cleanup(func() {
		c.Close()
		if sandbox != "" {
			testenv.WaitNoContainers(t, cli, docker.LabelSandbox, sandbox, 30*time.Second)
		}
		removeBuiltImages(cli, logs.String())
		if t.Failed() {
			t.Logf("server stderr:\n%s", logs)
		}
	})
	var mu sync.Mutex
	var progress []string
	c.OnNotification(func(n mcpgo.JSONRPCNotification) {
		if n.Method != "notifications/progress" {
			return
		}
		if msg, ok := n.Params.AdditionalFields["message"].(string); ok {
			mu.Lock()
			progress = append(progress, msg)
			mu.Unlock()
		}
	})
	ctx := context.Background()
	// The stdio constructor started the process; Start (idempotent) is
	// what routes notifications to OnNotification's handlers.
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Initialize(ctx, mcpgo.InitializeRequest{Params: mcpgo.InitializeParams{
		ProtocolVersion: mcpgo.LATEST_PROTOCOL_VERSION,
		ClientInfo:      mcpgo.Implementation{Name: "mcp-go-first-start", Version: "0"},
	}}); err != nil {
		t.Fatalf("initialize: %v", err)
	}
	if _, err := c.ListTools(ctx, mcpgo.ListToolsRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListResources(ctx, mcpgo.ListResourcesRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > bound {
		t.Fatalf("answered %s after the start, want within %s (%s and what the load adds to a process start)", d, bound, answerWithin)
	} else {
		t.Logf("initialize, tools/list, resources/list and ping answered %s after the start", d.Round(time.Millisecond))
	}
	var res *mcpgo.CallToolResult
	for try := 1; try <= 5; try++ {
		res, err = c.CallTool(ctx, mcpgo.CallToolRequest{Params: mcpgo.CallToolParams{Name: "sandbox_exec",
			Arguments: map[string]any{"argv": []string{"cat", "README"}}, Meta: &mcpgo.Meta{ProgressToken: fmt.Sprintf("first-%d", try)}}})
		if err != nil {
			t.Fatal(err)
		}
		if !res.IsError {
			break
		}
		t.Logf("call %d: %v", try, res.Content)
	}
	if res.IsError {
		t.Fatalf("the first call: %v", res.Content)
	}
	out, _ := res.StructuredContent.(map[string]any)
	if out["stdout"] != readme {
		t.Fatalf("the first call's output: %v", out)
	}
	sandbox, _ = out["sandbox"].(string)
	mu.Lock()
	defer mu.Unlock()
	if all := strings.Join(progress, "\n"); !strings.Contains(all, "sandbox-mcp: building the read-only workspace's image") || !strings.Contains(all, "the --workspace-from content is new to this engine") {
		t.Fatalf("progress of the first call: %q", progress)
	}
}

// TestPrepareThenStart: `sandbox-mcp prepare` (what `make run` runs first)
// returns once everything is prepared, here an image for a new agent and a
// new seed, so a server started next with the same flags builds nothing:
// its first call hears of no preparation.
func TestPrepareThenStart(t *testing.T) {
	cli := testenv.Engine(t)
	args, readme := firstStartArgs(t, docker.AgentMountImage, true)
	prep := exec.Command(bins.Get(t).Server, append([]string{"prepare"}, args...)...)
	prep.Env = serverEnv(t)
	out, err := prep.CombinedOutput()
	t.Cleanup(func() { removeBuiltImages(cli, string(out)) })
	if err != nil || !strings.Contains(string(out), "sandboxes prepared in") || !strings.Contains(string(out), "building the sandbox image") {
		t.Fatalf("prepare: %v\n%s", err, out)
	}
	s := startServer(t, serverOpts{args: args[len(serverArgs(t)):]})
	var mu sync.Mutex
	var progress []string
	s.mu.Lock()
	s.onProgress = map[any]func(string){"after-prepare": func(msg string) {
		mu.Lock()
		progress = append(progress, msg)
		mu.Unlock()
	}}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_exec", Meta: mcp.Meta{"progressToken": "after-prepare"},
		Arguments: map[string]any{"argv": []string{"cat", "README"}}})
	if err != nil || res.IsError {
		t.Fatalf("the first call: %v %s", err, text(res))
	}
	m, _ := res.StructuredContent.(map[string]any)
	s.mu.Lock()
	s.sandboxes[m["sandbox"].(string)] = true
	s.mu.Unlock()
	if m["stdout"] != readme {
		t.Fatalf("the first call's output: %v", m)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, msg := range progress {
		if strings.Contains(msg, "building") {
			t.Errorf("the server built something after prepare: %q", msg)
		}
	}
	if strings.Contains(s.stderr.String(), "building the") {
		t.Errorf("the server's log says it built something after prepare")
	}
}
