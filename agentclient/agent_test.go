package agentclient

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agent"
	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// realAgent is the real agent (agent.Serve) serving a conn in this process,
// over pipes, on a workspace directory of its own.
type realAgent struct {
	workspace string
	bin       string     // the agent's PATH: one directory holding "tool"
	served    chan error // what Serve returned
	raw       closerFunc // the server's end of the stream
}

// realAgentConn starts the real agent and connects a conn to it with the
// given lease. The agent runs as this process runs (it has not dropped
// privileges), so the tests stay clear of exec's start of a command, which
// needs the identity DropPrivileges sets up; everything else is the agent
// of a sandbox.
func realAgentConn(t *testing.T, lease time.Duration) (*Conn, *realAgent) {
	t.Helper()
	ra := &realAgent{workspace: t.TempDir(), bin: t.TempDir(), served: make(chan error, 1)}
	if err := os.WriteFile(filepath.Join(ra.bin, "tool"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ra.raw = func() error {
		inW.Close()
		outR.Close()
		return nil
	}
	go func() {
		err := agent.Serve(context.Background(), inR, outW, agent.Options{
			Workspace: ra.workspace,
			User:      agent.User{UID: 1000, GID: 1000},
			Path:      []string{ra.bin},
			Logger:    testLogger(t),
		})
		// The agent's exit closes its stdout, as the container's end does.
		outW.Close()
		ra.served <- err
	}()
	t.Cleanup(func() {
		ra.raw.Close()
		select {
		case err := <-ra.served:
			ra.served <- err
		case <-time.After(10 * time.Second):
			t.Error("the agent did not return after its stream closed")
		}
	})
	c, err := New(ctxFor(t), outR, inW, ra.raw, lease, "", testLogger(t))
	if err != nil {
		t.Fatalf("newConn with the real agent: %v", err)
	}
	return c, ra
}

// TestConnWithTheRealAgent: the server's end and the agent's end of the
// protocol, both real, agree on every request but exec's start: the hello,
// ping, write, read (whole and cut), list, resolve, snapshot and restore,
// errors the agent reports (an unknown request kind, a path outside the
// workspace, a missing program), and a clean end when the server closes the
// stream.
func TestConnWithTheRealAgent(t *testing.T) {
	c, ra := realAgentConn(t, time.Minute)
	ctx := ctxFor(t)

	if h := c.hello; h.Version != agentproto.Version || h.Agent != "sandbox-agent "+agent.Version() || h.PID != os.Getpid() ||
		h.Workspace != ra.workspace || h.CommandUID != 1000 || h.CommandGID != 1000 || h.CommandGroups[1] == 0 {
		t.Fatalf("hello: %+v", h)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}

	w, err := c.WriteFile(ctx, "a.txt", strings.NewReader("hello\n"), 6, false, 0o644)
	if err != nil || w.Written != 6 || w.Size != 6 {
		t.Fatalf("write: %+v %v", w, err)
	}
	r, err := c.ReadFile(ctx, "a.txt", 0, 0, 100)
	if err != nil || string(r.Data) != "hello\n" || r.Size != 6 || r.Truncated {
		t.Fatalf("read: %+v %v", r, err)
	}
	r, err = c.ReadFile(ctx, "a.txt", 1, 0, 3)
	if err != nil || string(r.Data) != "ell" || r.Size != 6 || !r.Truncated {
		t.Fatalf("a read cut at 3 bytes: %+v %v", r, err)
	}
	_, err = c.ReadFile(ctx, "../outside", 0, 0, 100)
	wantCode(t, err, errcode.OutsideWorkspace)

	entries, truncated, err := listed(c.List(ctx, ".", ListOptions{Recursive: false, MaxEntries: 10}))
	if err != nil || truncated || len(entries) != 1 || entries[0].Path != "a.txt" || entries[0].Size != 6 {
		t.Fatalf("list: %+v %v %v", entries, truncated, err)
	}

	paths, err := c.Resolve(ctx, []string{"tool", "missing"}, ".")
	if err != nil || !slices.Equal(paths, []string{filepath.Join(ra.bin, "tool"), ""}) {
		t.Fatalf("resolve: %q %v", paths, err)
	}
	_, err = c.Exec(ctx, ExecRequest{Argv: []string{"missing"}, Cwd: ".", Timeout: time.Second, MaxOutput: 10}, JobOpts{})
	wantCode(t, err, errcode.NotFound)

	var tarball bytes.Buffer
	lim := agentproto.Limits{MaxBytes: 1 << 20, MaxEntries: 100, MaxDepth: 10}
	snap, err := c.Snapshot(ctx, &tarball, lim)
	if err != nil || snap.Files != 1 || snap.Bytes != int64(tarball.Len()) {
		t.Fatalf("snapshot: %+v (%d bytes) %v", snap, tarball.Len(), err)
	}
	if _, err := c.WriteFile(ctx, "b.txt", strings.NewReader("later"), 5, false, 0o644); err != nil {
		t.Fatal(err)
	}
	rest, err := c.Restore(ctx, &tarball, lim)
	if err != nil || rest.Files != 1 {
		t.Fatalf("restore: %+v %v", rest, err)
	}
	if entries, _, err := listed(c.List(ctx, ".", ListOptions{Recursive: false, MaxEntries: 10})); err != nil || len(entries) != 1 || entries[0].Path != "a.txt" {
		t.Fatalf("after the restore: %+v %v", entries, err)
	}

	// A request kind the agent does not know fails that request only.
	p, err := c.open(ctx, "shell", nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.next(ctx, p)
	c.close(p)
	if err != nil || f.Kind != agentproto.KindError {
		t.Fatalf("an unknown request kind: %+v %v", f.Header, err)
	}
	if e := wantCode(t, c.decodeError(f), errcode.InvalidArgument); !strings.Contains(e.Message, `unknown request kind "shell"`) {
		t.Fatalf("an unknown request kind: %v", e)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("ping after the errors: %v", err)
	}

	ra.raw.Close()
	select {
	case err := <-ra.served:
		if err != nil {
			t.Fatalf("the agent after the server closed the stream: %v", err)
		}
		ra.served <- err
	case <-time.After(callTimeout):
		t.Fatal("the agent did not end when the server closed the stream")
	}
}

// TestRealAgentEndsWhenTheServerIsSilent: with a lease and no frame from
// the server (no ping), the agent ends itself after the lease, and the
// server's end sees the stream end.
func TestRealAgentEndsWhenTheServerIsSilent(t *testing.T) {
	const lease = 300 * time.Millisecond
	start := time.Now()
	c, ra := realAgentConn(t, lease)
	select {
	case err := <-ra.served:
		ra.served <- err
		if !errors.Is(err, agent.ErrLeaseExpired) {
			t.Fatalf("the agent ended with %v, want its lease expired", err)
		}
	case <-time.After(callTimeout):
		t.Fatal("the agent outlived its lease")
	}
	if took := time.Since(start); took < lease {
		t.Fatalf("the agent ended %s after the start, before its lease (%s)", took, lease)
	}
	select {
	case <-c.dead:
		if err := c.Err(); err.Error() != "the agent's stream ended" {
			t.Fatalf("the connection ended with %v", err)
		}
	case <-time.After(callTimeout):
		t.Fatal("the connection outlived the agent")
	}
}
