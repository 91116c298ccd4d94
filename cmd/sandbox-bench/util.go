package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// median returns the median of xs (ms).
func median(xs []float64) float64 { return percentile(xs, 50) }

// percentile returns the p-th percentile of xs by nearest rank.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func fmtMs(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 10:
		return fmt.Sprintf("%.1f ms", v)
	default:
		return fmt.Sprintf("%.2f ms", v)
	}
}

func cmdOutput(name string, args ...string) string {
	out, _ := exec.Command(name, args...).Output()
	return string(out)
}

// timeCmd runs a command n times and returns each run's duration in ms.
func timeCmd(n int, stdin []byte, name string, args ...string) ([]float64, error) {
	var out []float64
	for range n {
		cmd := exec.Command(name, args...)
		if stdin != nil {
			cmd.Stdin = strings.NewReader(string(stdin))
		}
		cmd.Stdout = io.Discard
		start := time.Now()
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
		}
		out = append(out, ms(time.Since(start)))
	}
	return out, nil
}

// server is a sandbox-mcp process serving HTTP on a loopback port.
type server struct {
	cmd   *exec.Cmd
	url   string
	state string
	mu    sync.Mutex
	tail  []string
	// handler holds the time the server's tool handlers took, per tool, from
	// its "tool call" log records.
	handler map[string][]float64
	exit    chan struct{}
}

var (
	urlRE      = regexp.MustCompile(`url=(http://\S+/mcp)`)
	toolCallRE = regexp.MustCompile(`msg="tool call" tool=(\S+) .*duration_ms=([0-9.]+)`)
)

// handlerMedian is the median time the server's handler for a tool took.
func (s *server) handlerMedian(tool string) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return median(s.handler[tool])
}

// startServer starts bin/sandbox-mcp on 127.0.0.1 (no token: loopback) with
// the bench's image and extra flags, and waits until it serves.
func (b *bench) startServer(extra ...string) (*server, error) {
	state, err := os.MkdirTemp("", "sandbox-bench-state-")
	if err != nil {
		return nil, err
	}
	args := append([]string{"--http", "127.0.0.1:0", "--image", b.image, "--state-dir", state,
		"--agent-bin", filepath.Join(b.bin, "sandbox-agent"), "--log-level", "info"}, extra...)
	s := &server{state: state, exit: make(chan struct{}), handler: map[string][]float64{}}
	s.cmd = exec.Command(filepath.Join(b.bin, "sandbox-mcp"), args...)
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			if m := urlRE.FindStringSubmatch(line); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
			s.mu.Lock()
			if m := toolCallRE.FindStringSubmatch(line); m != nil {
				if v, err := strconv.ParseFloat(m[2], 64); err == nil {
					s.handler[m[1]] = append(s.handler[m[1]], v)
				}
			}
			s.tail = append(s.tail, line)
			if len(s.tail) > 20 {
				s.tail = s.tail[1:]
			}
			s.mu.Unlock()
		}
	}()
	go func() { s.cmd.Wait(); close(s.exit) }()
	select {
	case s.url = <-found:
		return s, nil
	case <-s.exit:
		return nil, fmt.Errorf("sandbox-mcp exited: %s", s.lastLines())
	case <-time.After(2 * time.Minute):
		s.stop()
		return nil, errors.New("sandbox-mcp did not start serving within 2 minutes")
	}
}

func (s *server) lastLines() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.tail, "\n")
}

func (s *server) pid() int { return s.cmd.Process.Pid }

// stop ends the server as an operator would (SIGTERM) and waits.
func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exit:
	case <-time.After(time.Minute):
		_ = s.cmd.Process.Kill()
		<-s.exit
	}
	os.RemoveAll(s.state)
}

// rssKiB reads the server's resident memory.
func (s *server) rssKiB() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid()))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	return 0, errors.New("no VmRSS")
}

// connect opens a new MCP session.
func (s *server) connect(ctx context.Context) (*mcp.ClientSession, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "sandbox-bench", Version: "1"}, nil)
	return c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.url}, nil)
}

// call calls a tool and fails on a tool error.
func call(ctx context.Context, cs *mcp.ClientSession, name string, args map[string]any) (map[string]any, error) {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		return nil, err
	}
	if res.IsError {
		var b strings.Builder
		for _, c := range res.Content {
			if t, ok := c.(*mcp.TextContent); ok {
				b.WriteString(t.Text)
			}
		}
		return nil, fmt.Errorf("%s: %s", name, b.String())
	}
	m, _ := res.StructuredContent.(map[string]any)
	return m, nil
}

func execTrue(ctx context.Context, cs *mcp.ClientSession) error {
	out, err := call(ctx, cs, "sandbox_exec", map[string]any{"argv": []string{"true"}})
	if err != nil {
		return err
	}
	if out["exit_code"] != float64(0) {
		return fmt.Errorf("true exited %v", out["exit_code"])
	}
	return nil
}

// runningOf counts the running sandbox containers a server process owns.
func runningOf(pid int) int {
	out := cmdOutput("docker", "ps", "-q", "--filter", "label=io.sandbox-mcp.pid="+strconv.Itoa(pid), "--filter", "status=running")
	return len(strings.Fields(out))
}
