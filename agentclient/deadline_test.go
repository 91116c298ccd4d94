package agentclient

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// The agent stops work the server gave up on (issue 18, item 7). A scan
// that the agent went on with after the server answered TIMEOUT held the
// workspace's lock: a restore, which needs it alone, waited for it. These
// tests run the real agent over pipes on a host directory; what they
// show is that the agent is free again soon after the server's deadline.

// hugeSparse makes rel, in the real agent's workspace, a sparse file of a
// tebibyte or so (what the host's file system allows) that starts with
// head and has no line end after it: scanning it for lines takes minutes.
func hugeSparse(t *testing.T, ra *realAgent, rel, head string) {
	t.Helper()
	p := filepath.Join(ra.workspace, rel)
	if err := os.WriteFile(p, []byte(head), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, size := range []int64{1 << 62, 1 << 40, 1 << 38} {
		if os.Truncate(p, size) == nil {
			return
		}
	}
	t.Skip("cannot make a sparse file of 256 GiB here")
}

// freed fails the test unless the agent's workspace lock is free within
// limit: a restore (of an empty tree) takes it alone, so it waits for any
// operation still in flight.
func freed(t *testing.T, c *Conn, limit time.Duration) {
	t.Helper()
	var empty bytes.Buffer
	tar.NewWriter(&empty).Close()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	start := time.Now()
	if _, err := c.Restore(ctx, &empty, agentproto.TreeLimits(1<<20)); err != nil {
		t.Fatalf("a restore after the abandoned operation: %v after %v: the agent still holds the workspace", err, time.Since(start).Round(time.Millisecond))
	}
}

// A line read the server stops waiting for (its deadline passes) stops in
// the agent too; so does one the server cancels.
func TestAgentStopsALineReadTheServerGaveUpOn(t *testing.T) {
	c, ra := realAgentConn(t, time.Minute)
	hugeSparse(t, ra, "huge", "one\n")

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := c.Read(ctx, agentproto.ReadRequest{Path: "huge", StartLine: 2, Max: 1 << 20})
	if err == nil {
		t.Fatal("a line read of a huge file within 500 ms succeeded")
	}
	freed(t, c, 20*time.Second)

	hugeSparse(t, ra, "huge", "one\n")
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	if _, err := c.Read(ctx, agentproto.ReadRequest{Path: "huge", StartLine: 2, Max: 1 << 20}); err == nil {
		t.Fatal("a cancelled line read succeeded")
	}
	freed(t, c, 20*time.Second)
}

// The request's own deadline stops it in the agent, with no cancel frame:
// the agent answers TIMEOUT by itself.
func TestAgentStopsARequestAtItsDeadline(t *testing.T) {
	c, ra := realAgentConn(t, time.Minute)
	hugeSparse(t, ra, "huge", "one\n")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	p, err := c.open(ctx, agentproto.KindRead, agentproto.ReadRequest{Path: "huge", StartLine: 2, Max: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.close(p)
	// Wait well past the deadline, without cancelling.
	f, err := c.next(ctxFor(t), p)
	if err != nil {
		t.Fatalf("no answer from the agent after the request's deadline: %v", err)
	}
	if f.Kind != agentproto.KindError {
		t.Fatalf("a %s frame, want an error", f.Kind)
	}
	if e := wantCode(t, c.decodeError(f), errcode.Timeout); !strings.Contains(e.Message, "deadline") {
		t.Fatalf("message: %s", e.Message)
	}
	freed(t, c, 20*time.Second)
}

// A line read is bounded by the bytes it may scan: a line past them is
// refused at once, however large the file says it is.
func TestLineReadStopsAtItsScanBound(t *testing.T) {
	c, ra := realAgentConn(t, time.Minute)
	hugeSparse(t, ra, "huge", "one\n")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Line 2 starts in the bytes scanned (and goes on past them); line 3
	// is not in them.
	_, err := c.Read(ctx, agentproto.ReadRequest{Path: "huge", StartLine: 3, Max: 1 << 20, MaxScan: 8 << 20})
	if e := wantCode(t, err, errcode.InvalidArgument); !strings.Contains(e.Message, "line 3 is not in the first 8388608 bytes") {
		t.Fatalf("message: %s", e.Message)
	}
	freed(t, c, 20*time.Second)
}

// An edit whose near-miss search would compare lines × old lines stops at
// its byte budget: NOT_FOUND, promptly, and the workspace is free.
func TestNearMissEditIsBounded(t *testing.T) {
	c, ra := realAgentConn(t, time.Minute)
	content := strings.Repeat("a\n", 4<<20) // 8 MiB
	if err := os.WriteFile(filepath.Join(ra.workspace, "big"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	old := strings.Repeat("a\n", 10_000) + "b\n" + strings.Repeat("a\n", 10_000) + "a"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.EditFile(ctx, "big", []Edit{{OldText: old, NewText: "x"}}, 8<<20)
	wantCode(t, err, errcode.NotFound)
	freed(t, c, 20*time.Second)
}
