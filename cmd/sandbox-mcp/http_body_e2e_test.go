package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/tools"
)

// slowBody is a POST whose body a client sends slowly, over a raw
// connection: its headers, then all of the body but its last byte, a
// piece at a time, unless the server answers first.
type slowBody struct {
	conn net.Conn
	sent atomic.Int64 // body bytes written
	done chan struct{}
	resp *http.Response // the server's answer, once done is closed; nil if none
	err  error          // why there is none
}

func openSlowBody(t *testing.T, s *httpServer, hdr http.Header, length int64, pace time.Duration) *slowBody {
	t.Helper()
	conn, err := net.Dial("tcp", "127.0.0.1:"+s.port)
	if err != nil {
		t.Fatal(err)
	}
	b := &slowBody{conn: conn, done: make(chan struct{})}
	var head strings.Builder
	fmt.Fprintf(&head, "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: %d\r\n", s.port, length)
	for k, vs := range hdr {
		for _, v := range vs {
			fmt.Fprintf(&head, "%s: %s\r\n", k, v)
		}
	}
	head.WriteString("\r\n")
	go func() {
		defer close(b.done)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err == nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
			b.resp = resp
		}
		b.err = err
	}()
	go func() {
		if _, err := io.WriteString(conn, head.String()); err != nil {
			return
		}
		prefix := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"sandbox_write_file","arguments":{"path":"f","content":"`
		piece := []byte(prefix + strings.Repeat("a", 256<<10-len(prefix)))
		for b.sent.Load() < length-1 {
			select {
			case <-b.done:
				return // answered: the rest would never be read
			case <-time.After(pace):
			}
			n := min(int64(len(piece)), length-1-b.sent.Load())
			conn.SetWriteDeadline(time.Now().Add(time.Second))
			k, err := conn.Write(piece[:n])
			b.sent.Add(int64(k))
			if err != nil && !isTimeout(err) {
				return
			}
			piece = piece[:256<<10]
			for i := range piece {
				piece[i] = 'a'
			}
		}
	}()
	return b
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// answered returns the server's answer if one came within d.
func (b *slowBody) answered(d time.Duration) *http.Response {
	if d == 0 {
		select {
		case <-b.done:
			return b.resp
		default:
			return nil
		}
	}
	select {
	case <-b.done:
		return b.resp
	case <-time.After(d):
		return nil
	}
}

// Many slow request bodies from one caller keep the server's memory under
// its bound: each body is admitted into the in-flight budget (3 bytes per
// byte of its Content-Length) before a byte of it is read, a caller's
// bodies hold at most one session's share, and the rest are refused with
// 429 and Retry-After without being read. Another caller's call goes on.
func TestHTTPSlowBodiesStayInTheBound(t *testing.T) {
	const (
		inflight = 256 << 20
		share    = 128 << 20
		bodies   = 120
		length   = 11 << 20
	)
	s := startHTTP(t, httpOpts{bin: plainServer(t), args: []string{"--token", tokenA, "--token", tokenB,
		"--max-inflight-bytes", fmt.Sprint(inflight), "--max-session-inflight-bytes", fmt.Sprint(share), "--log-level", "info"}})
	b := s.connect(tokenB)
	// B's sandbox is up, with a file whose whole read reserves 107 MiB.
	b.ok(tools.NameExec, map[string]any{"argv": []string{"sh", "-c", "head -c 8388608 /dev/zero | tr '\\0' a > text"}})
	a := s.initialize(bearerHeader(tokenA))

	pid := s.cmd.Process.Pid
	baseline, err := procStatus(pid, "VmRSS")
	if err != nil {
		t.Fatal(err)
	}
	// The bound docs/resource-bounds.md states: idle, plus what calls and
	// bodies in flight may hold, plus 64 MiB.
	bound := baseline + inflight + 64<<20
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

	hdr := with(bearerHeader(tokenA), "Mcp-Session-Id", a, "MCP-Protocol-Version", "2025-11-25")
	var open []*slowBody
	var once sync.Once
	closeAll := func() {
		once.Do(func() {
			for _, sb := range open {
				sb.conn.Close()
			}
		})
	}
	defer closeAll()
	for range bodies {
		if peak.Load() > bound {
			break // past the bound already: spare the machine
		}
		open = append(open, openSlowBody(t, s, hdr, length, 10*time.Millisecond))
		time.Sleep(10 * time.Millisecond)
	}
	// Refusals come once a body has waited its 2 s for room.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && peak.Load() <= bound {
		time.Sleep(100 * time.Millisecond)
	}

	// Another caller's calls succeed meanwhile, a large read included:
	// A's bodies hold at most one session's share of the budget.
	out := b.ok(tools.NameExec, map[string]any{"argv": []string{"echo", "still here"}})
	if !strings.Contains(fmt.Sprint(out["stdout"]), "still here") {
		t.Errorf("B's exec during the load: %v", out)
	}
	if res := b.call(tools.NameReadFile, map[string]any{"path": "text", "byte_length": 8 << 20}); res.IsError {
		t.Errorf("B's 8 MiB read during the load: %.300s", text(res))
	}

	status := map[int]int{}
	var pending int
	var sent int64
	for _, sb := range open {
		sent += sb.sent.Load()
		resp := sb.answered(0)
		if resp == nil {
			if sb.err != nil {
				t.Errorf("a body got no answer: %v", sb.err)
			}
			pending++
			continue
		}
		status[resp.StatusCode]++
		if (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) && resp.Header.Get("Retry-After") == "" {
			t.Errorf("a %d without Retry-After", resp.StatusCode)
		}
	}
	close(stop)
	<-sampled
	if hwm, err := procStatus(pid, "VmHWM"); err == nil {
		peak.Store(max(peak.Load(), hwm))
	}
	closeAll()
	t.Logf("%d slow bodies of %d MiB opened: statuses %v, %d still arriving, %.0f MiB sent; server RSS %.0f MiB idle, peak %.0f MiB, bound %.0f MiB",
		len(open), length>>20, status, pending, float64(sent)/(1<<20), float64(baseline)/(1<<20), float64(peak.Load())/(1<<20), float64(bound)/(1<<20))
	if peak.Load() > bound {
		t.Fatalf("the server's RSS peaked at %d MiB, above its idle %d MiB plus the in-flight bound and 64 MiB (%d MiB)",
			peak.Load()>>20, baseline>>20, bound>>20)
	}
	if status[http.StatusTooManyRequests] == 0 {
		t.Errorf("no body was refused with 429 for the caller's share")
	}
	if len(open) < bodies {
		t.Errorf("only %d bodies opened", len(open))
	}

	// Once they are gone, A's room is back.
	r := s.do(http.MethodPost, "", hdr, `{"jsonrpc":"2.0","id":8,"method":"tools/list"}`)
	if r.status != http.StatusOK {
		t.Errorf("A's request after its bodies were dropped: %d %s", r.status, r.body)
	}
}

// A POST naming a session this server does not hold is refused before its
// body is read: the answer comes while the client is still sending. So is
// a body larger than the server takes (413), from its Content-Length.
func TestHTTPUnknownSessionRefusedBeforeItsBody(t *testing.T) {
	s := startHTTP(t, httpOpts{args: []string{"--token", tokenA}})
	for _, tc := range []struct {
		name   string
		hdr    http.Header
		length int64
		want   int
	}{
		{"made-up session id", with(bearerHeader(tokenA), "Mcp-Session-Id", "MADEUPSESSIONIDTHATNOONEHOLDS"), 11 << 20, http.StatusNotFound},
		{"body above the cap", bearerHeader(tokenA), 64 << 20, http.StatusRequestEntityTooLarge},
	} {
		sb := openSlowBody(t, s, tc.hdr, tc.length, 50*time.Millisecond)
		resp := sb.answered(10 * time.Second)
		sent := sb.sent.Load()
		sb.conn.Close()
		if resp == nil {
			t.Errorf("%s: no answer within 10 s while %d of %d body bytes were sent: the server waits for the body", tc.name, sent, tc.length)
			continue
		}
		if resp.StatusCode != tc.want || sent >= tc.length-1 {
			t.Errorf("%s: %d after %d of %d body bytes, want %d before the body was sent", tc.name, resp.StatusCode, sent, tc.length, tc.want)
		}
		t.Logf("%s: %d after %d of %d body bytes", tc.name, resp.StatusCode, sent, tc.length)
	}
}

// One caller cannot starve another of the in-flight budget. Caller A,
// alone, fills the budget with commands whose large stdin (arguments)
// stays reserved while they run; B's read is refused once. From then on A
// cannot take back what it gives up (while B asks, A may hold only its fair
// share), so B's retry gets the room. Before, A's next call took the room
// back each time, and B never got it.
func TestHTTPInflightBudgetIsFairBetweenCallers(t *testing.T) {
	const (
		share    = 110 << 20 // at least the largest call at the default file cap (107 MiB)
		inflight = 200 << 20 // A's fair share beside B: max(100, 110) MiB
	)
	// The server without the race detector: a refused call must come back
	// well within the wait below.
	s := startHTTP(t, httpOpts{bin: plainServer(t), args: []string{"--token", tokenA, "--token", tokenB, "--max-sessions", "48",
		"--max-sessions-per-caller", "24", "--max-calls-per-caller", "48", "--max-jobs", "32",
		"--max-inflight-bytes", fmt.Sprint(inflight), "--max-session-inflight-bytes", fmt.Sprint(share), "--log-level", "info"}})
	b := s.connect(tokenB)
	b.ok(tools.NameExec, map[string]any{"argv": []string{"sh", "-c", "echo hi > small"}})
	readSmall := map[string]any{"path": "small"}
	if res := b.call(tools.NameReadFile, readSmall); res.IsError {
		t.Fatalf("B's read alone: %s", text(res))
	}
	a := s.connect(tokenA)
	sandbox := a.ok(tools.NameExec, map[string]any{"argv": []string{"sh", "-c", "echo hi > small"}})["sandbox"].(string)

	// hold runs `sleep 60` with stdin of size bytes in A's sandbox, from a
	// session of its own, and reports whether it is still running (holding
	// its memory) well after the 2 s a refused body waits.
	type hold struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	var holds []hold
	defer func() {
		for _, h := range holds {
			h.cancel()
		}
	}()
	startHold := func(size int) bool {
		sess, err := s.tryConnect(tokenA)
		if err != nil {
			return false // its initialize found no room either
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			sess.cs.CallTool(ctx, &mcp.CallToolParams{Name: tools.NameExec, Arguments: map[string]any{
				"argv": []string{"sleep", "60"}, "stdin": strings.Repeat("a", size), "sandbox": sandbox}})
		}()
		select {
		case <-done:
			cancel()
			return false
		case <-time.After(4 * time.Second):
			holds = append(holds, hold{cancel, done})
			return true
		}
	}
	busy := func(res *mcp.CallToolResult) bool { return res.IsError && strings.HasPrefix(text(res), "BUSY: ") }

	// A, alone, fills the budget: commands with 5 MiB of stdin until one
	// does not fit, then smaller ones, until its own small read does not
	// fit.
	for _, size := range []int{5 << 20, 1 << 20, 256 << 10} {
		for len(holds) < 20 && startHold(size) {
		}
	}
	if res := a.call(tools.NameReadFile, readSmall); !busy(res) {
		t.Fatalf("A's %d commands did not fill the budget: A's own read got %.200s", len(holds), text(res))
	}
	if res := b.call(tools.NameReadFile, readSmall); !busy(res) {
		t.Fatalf("B's read while A fills the budget: want BUSY, got %.200s", text(res))
	}
	// A ends its first command and at once starts another like it.
	holds[0].cancel()
	<-holds[0].done
	time.Sleep(time.Second) // the dropped call ends and gives its memory back
	refilled := startHold(5 << 20)
	res := b.call(tools.NameReadFile, readSmall)
	t.Logf("A filled the budget with %d commands; B was refused once; A's next command ran: %v; B's retry: %.200s", len(holds), refilled, text(res))
	if res.IsError {
		t.Fatalf("B's read after A gave memory back: %.300s", text(res))
	}
	if refilled {
		t.Errorf("A took back the memory B was waiting for")
	}
}
