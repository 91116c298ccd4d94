package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
	"github.com/sandbox-mcp/sandbox-mcp/tools"
)

func TestMemoryLimit(t *testing.T) {
	env := envFrom(map[string]string{"HOME": t.TempDir()})
	cfg, err := ParseConfig(nil, env)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.MemoryLimit(), int64(policy.DefaultMaxSessionInflightBytes+memoryBase); got != want {
		t.Errorf("stdio: memory limit %d, want a session's share and the base, %d", got, want)
	}
	cfg, err = ParseConfig([]string{"--http", "127.0.0.1:0", "--max-inflight-bytes", "2GiB", "--max-session-inflight-bytes", "300MiB"}, env)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.MemoryLimit(), int64(2<<30+memoryBase); got != want {
		t.Errorf("HTTP: memory limit %d, want the total and the base, %d", got, want)
	}
	if cfg.Policy.MaxSessionInflightBytes != 300<<20 {
		t.Errorf("--max-session-inflight-bytes not applied: %d", cfg.Policy.MaxSessionInflightBytes)
	}
	if _, err := ParseConfig([]string{"--max-session-inflight-bytes", "32MiB"}, env); err == nil ||
		!strings.Contains(err.Error(), "--max-session-inflight-bytes") || !strings.Contains(err.Error(), "lower --max-file-bytes") {
		t.Errorf("a share too small for the largest call: %v", err)
	}
}

var plain struct {
	once sync.Once
	bin  string
	err  error
}

// plainServer returns a server binary built without the race detector,
// whose memory is the server's own: the race detector's shadow memory
// would multiply it.
func plainServer(t *testing.T) string {
	t.Helper()
	if !raceEnabled {
		return bins.Get(t).Server
	}
	plain.once.Do(func() {
		var b testenv.Binaries
		b, plain.err = testenv.Build(filepath.Join(bins.Get(t).Dir, "plain"), true, false)
		plain.bin = b.Server
	})
	if plain.err != nil {
		t.Fatal(plain.err)
	}
	return plain.bin
}

// procStatus reads a field of /proc/PID/status in bytes (VmRSS, VmHWM).
func procStatus(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// lineClient speaks newline-delimited JSON-RPC to a stdio server, and
// hands back each answer's raw line. The load below uses it instead of the
// go-sdk client: race-instrumented, that client decodes a 16 MiB answer in
// tens of seconds, and a slow reader keeps the server's answers, and their
// memory, waiting.
type lineClient struct {
	wmu sync.Mutex
	w   io.Writer

	mu      sync.Mutex
	nextID  int
	waiting map[int]chan []byte
	err     error
}

var lineID = regexp.MustCompile(`^\{"jsonrpc":"2\.0","id":(\d+),`)

func newLineClient(r io.Reader, w io.Writer) *lineClient {
	c := &lineClient{w: w, waiting: map[int]chan []byte{}}
	go func() {
		br := bufio.NewReaderSize(r, 1<<20)
		for {
			line, err := br.ReadBytes('\n')
			if err != nil {
				c.mu.Lock()
				c.err = err
				for _, ch := range c.waiting {
					close(ch)
				}
				c.waiting = nil
				c.mu.Unlock()
				return
			}
			m := lineID.FindSubmatch(line[:min(len(line), 64)])
			if m == nil {
				continue // a notification
			}
			id, _ := strconv.Atoi(string(m[1]))
			c.mu.Lock()
			if ch := c.waiting[id]; ch != nil {
				ch <- line
				delete(c.waiting, id)
			}
			c.mu.Unlock()
		}
	}()
	return c
}

// send writes a request (or, with notify, a notification) and returns the
// answer's line.
func (c *lineClient) send(method string, params any, notify bool) ([]byte, error) {
	msg := map[string]any{"jsonrpc": "2.0", "method": method, "params": params}
	var ch chan []byte
	if !notify {
		c.mu.Lock()
		if c.waiting == nil {
			c.mu.Unlock()
			return nil, fmt.Errorf("the server's stdout ended: %v", c.err)
		}
		c.nextID++
		msg["id"] = c.nextID
		ch = make(chan []byte, 1)
		c.waiting[c.nextID] = ch
		c.mu.Unlock()
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return nil, err
	}
	c.wmu.Lock()
	_, err = c.w.Write(append(b, '\n'))
	c.wmu.Unlock()
	if err != nil || notify {
		return nil, err
	}
	line, ok := <-ch
	if !ok {
		return nil, fmt.Errorf("the server's stdout ended: %v", c.err)
	}
	return line, nil
}

// toolAnswer is a tools/call answer, decoded when it is small.
type toolAnswer struct {
	Error  *struct{ Message string } `json:"error"`
	Result struct {
		IsError           bool                       `json:"isError"`
		Content           []struct{ Text string }    `json:"content"`
		StructuredContent map[string]json.RawMessage `json:"structuredContent"`
	} `json:"result"`
}

func (c *lineClient) tool(name string, args map[string]any) ([]byte, toolAnswer, error) {
	var a toolAnswer
	line, err := c.send("tools/call", map[string]any{"name": name, "arguments": args}, false)
	if err == nil && len(line) < 1<<20 {
		err = json.Unmarshal(line, &a)
	}
	return line, a, err
}

// Many concurrent large reads keep the server's memory under its bound:
// what a session's calls may hold at once, plus the base the runtime is
// allowed beside it, over what the idle server uses. Calls that do not fit
// get BUSY; nothing fails otherwise, and the session goes on.
func TestConcurrentLargeReadsStayInTheBound(t *testing.T) {
	img := testenv.TestImage(t) // skips under -short before the build
	cmd := exec.Command(plainServer(t), "--image", img, "--state-dir", t.TempDir(), "--agent-bin", bins.Get(t).Agent,
		"--memory", "256MiB", "--max-workspace-bytes", "64MiB", "--log-level", "info")
	cmd.Env = serverEnv(t)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	var sandbox string
	cli := testenv.Engine(t)
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Error("the server did not exit when its stdin closed")
		}
		if t.Failed() {
			t.Logf("server stderr:\n%s", stderr)
		}
		if sandbox != "" {
			testenv.WaitNoContainers(t, cli, docker.LabelSandbox, sandbox, 20*time.Second)
			testenv.RemoveLabelled(cli, docker.LabelSandbox, sandbox)
		}
	})
	c := newLineClient(stdout, stdin)
	if _, err := c.send("initialize", map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "e2e", "version": "0"}}, false); err != nil {
		t.Fatalf("initialize: %v\n%s", err, stderr)
	}
	if _, err := c.send("notifications/initialized", map[string]any{}, true); err != nil {
		t.Fatal(err)
	}

	const size = 8 << 20
	_, a, err := c.tool(tools.NameExec, map[string]any{"argv": []string{"sh", "-c",
		fmt.Sprintf("head -c %d /dev/zero | tr '\\0' a > text && head -c %d /dev/urandom > bin", size, size)}})
	if err != nil || a.Result.IsError || a.Error != nil {
		t.Fatalf("setup: %v %+v", err, a)
	}
	json.Unmarshal(a.Result.StructuredContent["sandbox"], &sandbox)

	pid := cmd.Process.Pid
	baseline, err := procStatus(pid, "VmRSS")
	if err != nil {
		t.Fatal(err)
	}
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if rss, err := procStatus(pid, "VmRSS"); err == nil && rss > peak.Load() {
				peak.Store(rss)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()

	const n = 32 // of each kind
	var ok, busy atomic.Int64
	var mu sync.Mutex
	var failures []string
	fail := func(s string) {
		mu.Lock()
		failures = append(failures, s)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for i := range 2 * n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := []string{"text", "bin"}[i%2]
			line, a, err := c.tool(tools.NameReadFile, map[string]any{"path": path, "byte_length": size})
			switch {
			case err != nil:
				fail(err.Error())
			case len(line) < 1<<20 && a.Error != nil:
				fail(a.Error.Message)
			case len(line) < 1<<20 && a.Result.IsError && len(a.Result.Content) > 0 && strings.HasPrefix(a.Result.Content[0].Text, "BUSY: "):
				busy.Add(1)
			case len(line) < 1<<20:
				fail(string(line))
			default:
				// The whole file came back: the text, or the
				// binary as base64, in the structured content and in
				// the text block.
				want, got := size, bytes.Count(line, []byte("a"))
				if path == "bin" {
					want, got = base64.StdEncoding.EncodedLen(size), len(line)
				}
				if got < want {
					fail(fmt.Sprintf("%s: an answer of %d bytes does not carry the %d-byte file", path, len(line), size))
				}
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	hwm, err := procStatus(pid, "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	peak.Store(max(peak.Load(), hwm))

	// The documented bound: what the session's calls may hold, and 64 MiB.
	bound := int64(policy.DefaultMaxSessionInflightBytes + 64<<20)
	t.Logf("%d reads of %d MiB: %d answered, %d BUSY; server RSS %.0f MiB idle, peak %.0f MiB; bound %.0f MiB over idle",
		2*n, size>>20, ok.Load(), busy.Load(), float64(baseline)/(1<<20), float64(peak.Load())/(1<<20), float64(bound)/(1<<20))
	if len(failures) > 0 {
		t.Errorf("%d reads failed otherwise than BUSY: %q", len(failures), failures)
	}
	if ok.Load() == 0 || busy.Load() == 0 {
		t.Errorf("%d reads answered and %d BUSY: want both", ok.Load(), busy.Load())
	}
	if peak.Load() > baseline+bound {
		t.Errorf("the server's RSS peaked at %d MiB, above its idle %d MiB plus the bound of %d MiB",
			peak.Load()>>20, baseline>>20, bound>>20)
	}

	// The memory came back, and the session goes on in the same sandbox.
	line, a, err := c.tool(tools.NameReadFile, map[string]any{"path": "text", "byte_length": 100})
	if err != nil || a.Result.IsError || a.Error != nil {
		t.Fatalf("a read after the load: %v %s", err, line)
	}
	var id string
	json.Unmarshal(a.Result.StructuredContent["sandbox"], &id)
	if id != sandbox {
		t.Fatalf("the read after the load ran in sandbox %q, not %q", id, sandbox)
	}
	if _, a, err = c.tool(tools.NameReadFile, map[string]any{"path": "bin", "byte_length": size}); err != nil || a.Result.IsError || a.Error != nil {
		t.Fatalf("a whole read after the load: %v %+v", err, a)
	}
}
