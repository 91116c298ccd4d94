package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// firstStart measures the first start after a build that changed the
// agent, the two ways a sandbox can get it: bind-mounted (nothing to build;
// the default on a local engine) and in an image built for it (what a
// remote engine needs, and what every start after an agent change did
// before). Each run builds an agent with a version of its own, so the
// engine has never seen it; the time is from the process's start to the
// answer to initialize, and to the first sandbox_exec's result (calling
// again while the call says the preparation goes on).
func (b *bench) firstStart(ctx context.Context) error {
	type result struct{ init, first []float64 }
	var res [2]result
	for i, how := range []string{"bind", "image"} {
		n := 3
		if how == "image" {
			n = 1 // each run builds an image of the sandbox image: minutes on a loaded engine
		}
		for range n {
			init, first, err := b.firstStartOnce(ctx, how)
			if err != nil {
				return fmt.Errorf("--agent-mount=%s: %w", how, err)
			}
			res[i].init = append(res[i].init, init)
			res[i].first = append(res[i].first, first)
		}
		b.series("first start after a build, --agent-mount="+how+": first exec", res[i].first)
	}
	bind, img := res[0], res[1]
	r := median(bind.first) / median(img.first)
	b.add(Row{
		Measure:  "first start after a build that changed the agent, agent bind-mounted (process start → `initialize` answered; → first `sandbox_exec` result)",
		Value:    fmt.Sprintf("%s; %s", fmtMs(median(bind.init)), fmtMs(median(bind.first))),
		Baseline: fmt.Sprintf("agent in an image built at start (`--agent-mount=image`): %s; %s", fmtMs(median(img.init)), fmtMs(median(img.first))),
		Ratio:    r,
		Goal:     "`initialize` ≤ 1 s either way",
		Met:      median(bind.init) <= 1000 && median(img.init) <= 1000,
		Note:     "ratio is of the first exec",
	})
	return nil
}

var runtimeImageRE = regexp.MustCompile(`runtime_image=(sandbox-mcp-runtime:[0-9a-f]+)`)

// firstStartOnce builds a new agent, starts the server over stdio with it,
// and returns the milliseconds to initialize's answer and to the first
// exec's result. An image it made for the agent is removed.
func (b *bench) firstStartOnce(ctx context.Context, how string) (init, first float64, err error) {
	dir, err := os.MkdirTemp("", "sandbox-bench-first-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	id := make([]byte, 8)
	rand.Read(id)
	agent := filepath.Join(dir, "sandbox-agent")
	build := exec.Command("go", "build", "-trimpath", "-ldflags",
		"-s -w -X github.com/sandbox-mcp/sandbox-mcp/agent.version=bench-"+hex.EncodeToString(id), "-o", agent, "./cmd/sandbox-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return 0, 0, fmt.Errorf("build the agent: %v\n%s", err, out)
	}
	cmd := exec.Command(filepath.Join(b.bin, "sandbox-mcp"), "--image", b.image, "--state-dir", dir,
		"--agent-bin", agent, "--agent-mount", how, "--log-level", "info")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return 0, 0, err
	}
	var mu sync.Mutex
	var built []string
	var tail []string
	var lines sync.WaitGroup
	lines.Go(func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			if m := runtimeImageRE.FindStringSubmatch(sc.Text()); m != nil {
				built = append(built, m[1])
			}
			tail = append(tail, sc.Text())
			if len(tail) > 20 {
				tail = tail[1:]
			}
			mu.Unlock()
		}
	})
	defer func() {
		lines.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, tag := range built {
			cmdOutput("docker", "rmi", "-f", tag)
		}
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, strings.Join(tail, "\n"))
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	start := time.Now()
	c := mcp.NewClient(&mcp.Implementation{Name: "sandbox-bench", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 30 * time.Second}, nil)
	if err != nil {
		return 0, 0, err
	}
	defer cs.Close()
	init = ms(time.Since(start))
	for {
		err = execTrue(ctx, cs)
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "UNAVAILABLE: sandboxes are not ready yet") || ctx.Err() != nil {
			return 0, 0, err
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return 0, 0, err
		}
	}
	return init, ms(time.Since(start)), nil
}
