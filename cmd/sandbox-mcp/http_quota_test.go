package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// rawPost sends one JSON-RPC POST to /mcp, safe to call from any goroutine
// (it reports instead of failing the test).
func (s *httpServer) rawPost(hdr http.Header, body string) (reply, error) {
	req, err := http.NewRequest(http.MethodPost, s.url, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range hdr {
		req.Header[http.CanonicalHeaderKey(k)] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return reply{resp.StatusCode, resp.Header, string(b)}, nil
}

// liveSessions returns the ids among ids whose session still answers.
func (s *httpServer) liveSessions(hdr http.Header, ids []string) []string {
	s.t.Helper()
	var live []string
	for _, id := range ids {
		r := s.do(http.MethodPost, "", with(hdr, "Mcp-Session-Id", id), `{"jsonrpc":"2.0","id":99,"method":"ping"}`)
		switch r.status {
		case http.StatusOK:
			live = append(live, id)
		case http.StatusNotFound:
		default:
			s.t.Fatalf("ping of session %s: %d %s", id, r.status, r.body)
		}
	}
	return live
}

// initializeVariants are initialize requests spelled the ways a guard that
// parses bodies can misread: keys in other cases, duplicate keys in both
// orders, and batches (accepted without a protocol version header).
var initializeVariants = map[string]string{
	"plain":                  initializeBody,
	"extra Method key":       strings.Replace(initializeBody, `"method":"initialize"`, `"method":"initialize","Method":"x"`, 1),
	"extra METHOD key":       strings.Replace(initializeBody, `"method":"initialize"`, `"METHOD":"x","method":"initialize","METHOD":"y"`, 1),
	"duplicate, x last":      strings.Replace(initializeBody, `"method":"initialize"`, `"method":"initialize","method":"x"`, 1),
	"duplicate, x first":     strings.Replace(initializeBody, `"method":"initialize"`, `"method":"x","method":"initialize"`, 1),
	"batch of one":           "[" + initializeBody + "]",
	"batch behind a notice":  `[{"jsonrpc":"2.0","method":"notifications/x"},` + initializeBody + "]",
	"batch with Method keys": "[" + strings.Replace(initializeBody, `"method":"initialize"`, `"Method":"x","method":"initialize"`, 1) + "]",
}

// TestHTTPMaxSessionsHoldsWhateverTheBody: however an initialize is
// spelled, and however many arrive at once, no more than --max-sessions
// sessions live; refused requests get 503 with Retry-After, and room comes
// back when sessions end.
func TestHTTPMaxSessionsHoldsWhateverTheBody(t *testing.T) {
	const max = 3
	s := startHTTP(t, httpOpts{args: []string{"--max-sessions", fmt.Sprint(max)}})

	var (
		mu     sync.Mutex
		ids    []string
		errs   []error
		status = map[int]int{}
	)
	var wg sync.WaitGroup
	for round := range 4 {
		for name, body := range initializeVariants {
			for range 3 {
				wg.Go(func() {
					r, err := s.rawPost(nil, body)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						errs = append(errs, fmt.Errorf("round %d, %s: %w", round, name, err))
						return
					}
					status[r.status]++
					if id := r.header.Get("Mcp-Session-Id"); id != "" {
						ids = append(ids, id)
					}
					if r.status == http.StatusServiceUnavailable && r.header.Get("Retry-After") == "" {
						errs = append(errs, fmt.Errorf("%s: 503 without Retry-After", name))
					}
				})
			}
		}
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	live := s.liveSessions(nil, ids)
	t.Logf("%d requests: statuses %v, %d session ids handed out, %d live", 4*3*len(initializeVariants), status, len(ids), len(live))
	if len(live) > max {
		t.Fatalf("%d sessions live, above --max-sessions %d", len(live), max)
	}
	if status[http.StatusServiceUnavailable] == 0 {
		t.Fatal("no request was refused for the cap")
	}

	// Ending the sessions gives their room back, to the last place.
	for _, id := range live {
		if r := s.do(http.MethodDelete, "", with(nil, "Mcp-Session-Id", id), ""); r.status != http.StatusNoContent {
			t.Fatalf("DELETE %s: %d %s", id, r.status, r.body)
		}
	}
	if again := s.burst(nil, max); len(again) != max {
		t.Fatalf("%d of %d sessions opened at once after the room came back", len(again), max)
	}
	if r := s.do(http.MethodPost, "", nil, initializeBody); r.status != http.StatusServiceUnavailable {
		t.Fatalf("a session past the cap after the room came back: %d %s", r.status, r.body)
	}
}

// burst sends n plain initializes at once and returns the session ids that
// came back.
func (s *httpServer) burst(hdr http.Header, n int) []string {
	s.t.Helper()
	var mu sync.Mutex
	var ids []string
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			r, err := s.rawPost(hdr, initializeBody)
			if err != nil {
				s.t.Error(err)
				return
			}
			if id := r.header.Get("Mcp-Session-Id"); r.status == http.StatusOK && id != "" {
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return s.liveSessions(hdr, ids)
}

// TestHTTPMaxSessionsAdmitsAFullBurst: as many clients as --max-sessions
// connecting at the same moment all get a session; one more does not.
func TestHTTPMaxSessionsAdmitsAFullBurst(t *testing.T) {
	const max = 12
	s := startHTTP(t, httpOpts{args: []string{"--max-sessions", fmt.Sprint(max)}})
	for round := range 3 {
		ids := s.burst(nil, max)
		if len(ids) != max {
			t.Fatalf("round %d: %d of %d sessions opened at once", round, len(ids), max)
		}
		if r := s.do(http.MethodPost, "", nil, initializeBody); r.status != http.StatusServiceUnavailable {
			t.Fatalf("round %d: a session past the cap: %d %s", round, r.status, r.body)
		}
		for _, id := range ids {
			s.do(http.MethodDelete, "", with(nil, "Mcp-Session-Id", id), "")
		}
	}
}

// TestHTTPSessionsPerCaller: one caller cannot take every place; past its
// own cap it gets 429 with Retry-After and a sentence naming the limit,
// however many times it asks at once, and another caller still gets a
// session.
func TestHTTPSessionsPerCaller(t *testing.T) {
	// Two callers and --max-sessions 8: each may hold a quarter, 2.
	s := startHTTP(t, httpOpts{args: []string{"--token", tokenA + "," + tokenB, "--max-sessions", "8"}})
	a := bearerHeader(tokenA)
	s.connect(tokenA)
	s.initialize(a)

	var wg sync.WaitGroup
	var mu sync.Mutex
	var got []reply
	for range 20 {
		wg.Go(func() {
			r, err := s.rawPost(a, initializeBody)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			got = append(got, r)
			mu.Unlock()
		})
	}
	wg.Wait()
	for _, r := range got {
		if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" || r.header.Get("Mcp-Session-Id") != "" {
			t.Fatalf("caller A past its cap: %d Retry-After=%q id=%q %s", r.status, r.header.Get("Retry-After"), r.header.Get("Mcp-Session-Id"), r.body)
		}
		if !strings.Contains(r.body, "BUSY") || !strings.Contains(r.body, "--max-sandboxes-per-caller") || !strings.Contains(r.body, "DELETE") {
			t.Fatalf("the 429 does not say which limit or what to do: %s", r.body)
		}
	}
	if _, err := s.tryConnect(tokenA); err == nil {
		t.Fatal("the go-sdk client of caller A got a session past its cap")
	}

	// Caller B is not held back by A.
	b := s.connect(tokenB)
	b.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})
	s.initialize(bearerHeader(tokenB))
	if r := s.do(http.MethodPost, "", bearerHeader(tokenB), initializeBody); r.status != http.StatusTooManyRequests {
		t.Fatalf("caller B past its cap: %d %s", r.status, r.body)
	}

	// sandbox://policy shows the caps.
	res, err := b.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "sandbox://policy"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"max_sessions": 8`, `"max_sessions_per_caller": 2`, `"max_calls_per_caller": 4`} {
		if !strings.Contains(res.Contents[0].Text, want) {
			t.Errorf("sandbox://policy lacks %s:\n%s", want, res.Contents[0].Text)
		}
	}
}

// TestHTTPCallsPerCaller: past --max-calls-per-caller a caller's tool call
// gets BUSY at once, and its resource read a JSON-RPC error, while another
// caller's calls run; when a call ends, room comes back.
func TestHTTPCallsPerCaller(t *testing.T) {
	s := startHTTP(t, httpOpts{args: []string{"--token", tokenA + "," + tokenB, "--max-calls-per-caller", "2"}})
	a := s.connect(tokenA)
	a.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})
	b := s.connect(tokenB)
	b.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})

	// Two calls of A that run until cancelled (tried again while the
	// test's own calls below take their place).
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				res, err := a.cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"argv": []string{"sleep", "600"}}})
				if ctx.Err() != nil {
					return
				}
				if err != nil || !res.IsError || !strings.HasPrefix(text(res), "BUSY: ") {
					t.Errorf("a long call of A ended by itself: %v %v", err, res)
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	defer wg.Wait()
	defer cancel()

	// A third call of A is refused at once (tried until both long calls
	// are in flight: then the refused call can only be this one).
	deadline := time.Now().Add(time.Minute)
	for {
		res := a.call("sandbox_list", map[string]any{})
		if res.IsError {
			msg := text(res)
			if !strings.HasPrefix(msg, "BUSY: ") || !strings.Contains(msg, "--max-calls-per-caller") {
				t.Fatalf("A's third call: %s", msg)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("A's third call was never refused")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Another session of A shares A's calls.
	if res := s.connect(tokenA).call("sandbox_list", map[string]any{}); !res.IsError || !strings.HasPrefix(text(res), "BUSY: ") {
		t.Fatalf("a call in A's other session: %v", text(res))
	}
	if _, err := a.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "sandbox://policy"}); err == nil ||
		!strings.Contains(err.Error(), "BUSY") || !strings.Contains(err.Error(), "--max-calls-per-caller") {
		t.Fatalf("A's resource read past the cap: %v", err)
	}
	// B's calls run beside A's.
	b.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})
	if _, err := b.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "sandbox://policy"}); err != nil {
		t.Fatalf("B's resource read: %v", err)
	}

	// A's long calls end: A has room again.
	cancel()
	wg.Wait()
	deadline = time.Now().Add(30 * time.Second)
	for {
		res := a.call("sandbox_list", map[string]any{})
		if !res.IsError {
			break
		}
		if !strings.HasPrefix(text(res), "BUSY: ") || time.Now().After(deadline) {
			t.Fatalf("A's call after its long calls ended: %s", text(res))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
