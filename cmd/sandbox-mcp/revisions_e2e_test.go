package main

// MCP 2026-07-28 (no protocol sessions) beside 2025-11-25, through the
// go-sdk client at its own preference (2026-07-28), over stdio and HTTP.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

const sessionless = "2026-07-28"

// TestStdioSessionless: over stdio a 2026-07-28 client (server/discover,
// then _meta on every request) gets the server's instructions and
// capabilities, and its calls without `sandbox` share the connection's
// sandbox: files written by one call are there for the next, with
// structured results.
func TestStdioSessionless(t *testing.T) {
	s := startServer(t, serverOpts{})
	init := s.cs.InitializeResult()
	if init.ProtocolVersion != sessionless {
		t.Fatalf("the go-sdk client negotiated %q over stdio, want %s", init.ProtocolVersion, sessionless)
	}
	if init.Capabilities == nil || init.Capabilities.Tools == nil || init.Capabilities.Resources == nil {
		t.Fatalf("server/discover gave capabilities %+v", init.Capabilities)
	}
	if !strings.Contains(init.Instructions, "Calls without `sandbox` share one sandbox") || !strings.Contains(init.Instructions, "sandbox://policy") {
		t.Fatalf("server/discover gave instructions %q", init.Instructions)
	}
	if init.ServerInfo == nil || init.ServerInfo.Name != "sandbox-mcp" {
		t.Fatalf("server/discover gave server info %+v", init.ServerInfo)
	}
	w := s.ok("sandbox_write_file", map[string]any{"path": "notes/a.txt", "content": "first\n"})
	id := w["sandbox"].(string)
	x := s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "cat notes/a.txt; echo second >> notes/a.txt"}})
	if x["stdout"] != "first\n" || x["sandbox"] != id {
		t.Fatalf("exec after the write: %v (want the file in sandbox %s)", x, id)
	}
	r := s.ok("sandbox_read_file", map[string]any{"path": "notes/a.txt"})
	if r["content"] != "first\nsecond\n" || r["sandbox"] != id {
		t.Fatalf("read after the exec: %v", r)
	}
	if l := s.ok("sandbox_list", map[string]any{"path": "notes"}); l["sandbox"] != id {
		t.Fatalf("list ran in another sandbox: %v", l)
	}
}

// TestHTTPSessionlessNoImplicitSandbox: over HTTP a 2026-07-28 client has
// no session and, without --default-sandbox, no implicit sandbox: a call
// without `sandbox` is told to make one and name it; it can name one of
// its caller's sandboxes (here a 2025-11-25 session's, served by the same
// server side by side), and another caller's is NOT_FOUND.
func TestHTTPSessionlessNoImplicitSandbox(t *testing.T) {
	s := startHTTP(t, httpOpts{env: []string{"SANDBOX_MCP_TOKEN=" + tokenA + "," + tokenB}})
	c := s.connectAt(tokenA, "")
	if v := c.cs.InitializeResult().ProtocolVersion; v != sessionless || c.cs.ID() != "" {
		t.Fatalf("the go-sdk client negotiated %q with session %q, want %s without one", v, c.cs.ID(), sessionless)
	}
	if ins := c.cs.InitializeResult().Instructions; !strings.Contains(ins, "create one with sandbox_create and pass its handle in `sandbox`") {
		t.Fatalf("the instructions do not say what a 2026-07-28 caller must do: %q", ins)
	}
	msg := c.fails("sandbox_exec", map[string]any{"argv": []string{"true"}}, "INVALID_ARGUMENT")
	if !strings.Contains(msg, "sandbox_create") || !strings.Contains(msg, `"sandbox"`) {
		t.Fatalf("the refusal does not say what to do: %s", msg)
	}

	old := s.connect(tokenA)
	id := old.ok("sandbox_write_file", map[string]any{"path": "shared.txt", "content": "from the session"})["sandbox"].(string)
	for range 2 {
		r := c.ok("sandbox_read_file", map[string]any{"path": "shared.txt", "sandbox": id})
		if r["content"] != "from the session" || r["sandbox"] != id {
			t.Fatalf("a 2026-07-28 call naming the caller's sandbox: %v", r)
		}
	}
	other := s.connectAt(tokenB, "")
	other.fails("sandbox_read_file", map[string]any{"path": "shared.txt", "sandbox": id}, "NOT_FOUND")
	// The requests' own sessions ended; the session's sandbox did not.
	if n := len(testenv.Containers(t, s.cli, docker.LabelSandbox, id)); n != 1 {
		t.Fatalf("the session's sandbox has %d containers after 2026-07-28 calls named it", n)
	}
	old.ok("sandbox_read_file", map[string]any{"path": "shared.txt"})
}

// TestHTTPSessionlessDefaultSandbox: with --default-sandbox=per-caller a
// 2026-07-28 call without `sandbox` uses its caller's default sandbox:
// two clients of one token share its files across calls (each call on a
// session that ends with it, which ends nothing else), another token's
// calls have their own; the server's exit removes them (the cleanup
// checks).
func TestHTTPSessionlessDefaultSandbox(t *testing.T) {
	s := startHTTP(t, httpOpts{env: []string{"SANDBOX_MCP_TOKEN=" + tokenA + "," + tokenB}, args: []string{"--default-sandbox", "per-caller"}})
	a1, a2, b := s.connectAt(tokenA, ""), s.connectAt(tokenA, ""), s.connectAt(tokenB, "")
	if ins := a1.cs.InitializeResult().Instructions; !strings.Contains(ins, "it uses your one default sandbox") {
		t.Fatalf("the instructions do not name the default sandbox: %q", ins)
	}
	id := a1.ok("sandbox_write_file", map[string]any{"path": "mine.txt", "content": "alpha"})["sandbox"].(string)
	if x := a1.ok("sandbox_exec", map[string]any{"argv": []string{"cat", "mine.txt"}}); x["stdout"] != "alpha" || x["sandbox"] != id {
		t.Fatalf("the next call of the same client: %v", x)
	}
	if r := a2.ok("sandbox_read_file", map[string]any{"path": "mine.txt"}); r["content"] != "alpha" || r["sandbox"] != id {
		t.Fatalf("another client of the same caller: %v", r)
	}
	b.fails("sandbox_read_file", map[string]any{"path": "mine.txt"}, "NOT_FOUND")
	idB := b.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})["sandbox"].(string)
	if idB == id {
		t.Fatal("two callers share a default sandbox")
	}
	b.fails("sandbox_read_file", map[string]any{"path": "mine.txt", "sandbox": id}, "NOT_FOUND")
	time.Sleep(500 * time.Millisecond) // a release at a request's end would be under way
	if n := len(testenv.Containers(t, s.cli, docker.LabelSandbox, id)); n != 1 {
		t.Fatalf("the default sandbox has %d containers once its requests ended", n)
	}
	if r := a1.ok("sandbox_read_file", map[string]any{"path": "mine.txt"}); r["content"] != "alpha" || r["sandbox"] != id {
		t.Fatalf("the default sandbox did not last: %v", r)
	}
}

// TestHTTPSessionlessHandles: a 2026-07-28 client over HTTP works with
// handles alone: sandbox_create gives one, every later request (each on a
// session of its own that ends with it) names it and finds its files, two
// handles of one caller are apart, sandbox_status lists both, another
// caller's calls find neither, and sandbox_end ends one for good.
func TestHTTPSessionlessHandles(t *testing.T) {
	s := startHTTP(t, httpOpts{env: []string{"SANDBOX_MCP_TOKEN=" + tokenA + "," + tokenB}})
	a, b := s.connectAt(tokenA, ""), s.connectAt(tokenB, "")
	h1 := a.ok("sandbox_create", map[string]any{"label": "one"})["sandbox"].(string)
	h2 := a.ok("sandbox_create", map[string]any{"label": "two"})["sandbox"].(string)
	if h1 == h2 || len(h1) < len("sb-")+32 {
		t.Fatalf("handles %q and %q: want two distinct handles of 128 bits", h1, h2)
	}
	a.ok("sandbox_write_file", map[string]any{"path": "f.txt", "content": "in one", "sandbox": h1})
	if x := a.ok("sandbox_exec", map[string]any{"argv": []string{"cat", "f.txt"}, "sandbox": h1}); x["stdout"] != "in one" || x["sandbox"] != h1 {
		t.Fatalf("a later request naming the handle: %v", x)
	}
	a.fails("sandbox_read_file", map[string]any{"path": "f.txt", "sandbox": h2}, "NOT_FOUND")
	status := func(c *server) string {
		res := c.call("sandbox_status", map[string]any{})
		if res.IsError {
			t.Fatalf("sandbox_status failed: %v", res.Content)
		}
		return fmt.Sprint(res.StructuredContent)
	}
	if st := status(a); !strings.Contains(st, h1) || !strings.Contains(st, h2) {
		t.Fatalf("sandbox_status does not list both handles: %s", st)
	}
	if st := status(b); strings.Contains(st, h1) || strings.Contains(st, h2) {
		t.Fatalf("another caller's sandbox_status lists this caller's handles: %s", st)
	}
	b.fails("sandbox_read_file", map[string]any{"path": "f.txt", "sandbox": h1}, "NOT_FOUND")
	a.ok("sandbox_end", map[string]any{"sandbox": h2})
	a.fails("sandbox_exec", map[string]any{"argv": []string{"true"}, "sandbox": h2}, "NOT_FOUND")
	if r := a.ok("sandbox_read_file", map[string]any{"path": "f.txt", "sandbox": h1}); r["content"] != "in one" {
		t.Fatalf("the other handle after an end: %v", r)
	}
}

// TestStdioSessionlessHandles: over stdio a 2026-07-28 client keeps the
// connection's sandbox for calls without `sandbox` and can make others by
// handle beside it.
func TestStdioSessionlessHandles(t *testing.T) {
	s := startServer(t, serverOpts{})
	if v := s.cs.InitializeResult().ProtocolVersion; v != sessionless {
		t.Fatalf("negotiated %q, want %s", v, sessionless)
	}
	own := s.ok("sandbox_write_file", map[string]any{"path": "f.txt", "content": "own"})["sandbox"].(string)
	h := s.ok("sandbox_create", map[string]any{})["sandbox"].(string)
	if h == own {
		t.Fatal("sandbox_create returned the connection's own sandbox")
	}
	s.ok("sandbox_write_file", map[string]any{"path": "f.txt", "content": "handle", "sandbox": h})
	if r := s.ok("sandbox_read_file", map[string]any{"path": "f.txt"}); r["content"] != "own" || r["sandbox"] != own {
		t.Fatalf("the connection's sandbox after a write by handle: %v", r)
	}
	if r := s.ok("sandbox_read_file", map[string]any{"path": "f.txt", "sandbox": h}); r["content"] != "handle" {
		t.Fatalf("the handle's file: %v", r)
	}
}
