package agentclient

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// TestConnFileOpsWithTheRealAgent: edit, delete, move and line reads go
// through both real ends of the protocol, with their results and their
// coded refusals intact.
func TestConnFileOpsWithTheRealAgent(t *testing.T) {
	c, ra := realAgentConn(t, time.Minute)
	ctx := ctxFor(t)
	ws := func(p string) string { return filepath.Join(ra.workspace, p) }
	if err := os.WriteFile(ws("a.txt"), []byte("one\ntwo\ntwo\nthree\n"), 0o640); err != nil {
		t.Fatal(err)
	}

	res, err := c.EditFile(ctx, "a.txt", []Edit{{OldText: "two", NewText: "2", ReplaceAll: false}}, 1<<20)
	if e, ok := errcode.As(err); !ok || e.Code != errcode.InvalidArgument {
		t.Fatalf("ambiguous edit: %v", err)
	}
	res, err = c.EditFile(ctx, "a.txt", []Edit{{OldText: "two", NewText: "2", ReplaceAll: true}}, 1<<20)
	if err != nil || res.Replacements != 2 || res.Size != 14 {
		t.Fatalf("edit: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(ws("a.txt")); string(b) != "one\n2\n2\nthree\n" {
		t.Fatalf("edited file: %q", b)
	}
	if fi, _ := os.Stat(ws("a.txt")); fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode not kept: %v", fi.Mode())
	}

	lr, err := c.Read(ctx, agentproto.ReadRequest{Path: "a.txt", Max: 1 << 20, StartLine: 2, EndLine: 3})
	if err != nil || string(lr.Data) != "2\n2\n" || lr.StartLine != 2 || lr.EndLine != 3 || lr.TotalLines != 4 || lr.Offset != 4 {
		t.Fatalf("lines: %+v %q %v", lr, lr.Data, err)
	}

	mr, err := c.Move(ctx, "a.txt", "sub/", false)
	if err != nil || mr.To != "sub/a.txt" || mr.Type != agentproto.TypeFile {
		t.Fatalf("move: %+v %v", mr, err)
	}
	if _, err := c.Move(ctx, "sub/a.txt", "../escape", false); err == nil {
		t.Fatal("move outside succeeded")
	} else if e, ok := errcode.As(err); !ok || e.Code != errcode.OutsideWorkspace {
		t.Fatalf("move outside: %v", err)
	}

	if _, err := c.Delete(ctx, "sub", false); err == nil {
		t.Fatal("delete of a full directory without recursive succeeded")
	}
	dr, err := c.Delete(ctx, "sub", true)
	if err != nil || dr.Deleted != 2 || dr.Type != agentproto.TypeDir {
		t.Fatalf("delete: %+v %v", dr, err)
	}
	if _, err := os.Lstat(ws("sub")); !os.IsNotExist(err) {
		t.Fatalf("sub still exists: %v", err)
	}
	// The connection is still good.
	if _, err := c.EditFile(ctx, "new.txt", []Edit{{OldText: "", NewText: "created", ReplaceAll: false}}, 1<<20); err != nil {
		t.Fatal(err)
	}
}

// TestHostileAgentFileOps: an agent that answers an edit, a delete, a move
// or a line read with a result out of bounds ends the connection.
func TestHostileAgentFileOps(t *testing.T) {
	edit := func(c *Conn) error {
		_, err := c.EditFile(ctxFor(t), "f", []Edit{{OldText: "a", NewText: "b", ReplaceAll: false}}, 100)
		return err
	}
	del := func(c *Conn) error {
		_, err := c.Delete(ctxFor(t), "f", true)
		return err
	}
	move := func(c *Conn) error {
		_, err := c.Move(ctxFor(t), "f", "g", false)
		return err
	}
	lines := func(c *Conn) error {
		_, err := c.Read(ctxFor(t), agentproto.ReadRequest{Path: "f", Max: 10, StartLine: 1})
		return err
	}
	for _, tc := range []struct {
		name   string
		call   func(*Conn) error
		answer func(a *agentEnd, req agentproto.Frame)
		why    string
	}{
		{"an edit leaving a file past the cap", edit, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindResult, agentproto.EditResult{Replacements: 1, Size: 101}, nil)
		}, "edit result out of bounds"},
		{"an edit of negative replacements", edit, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindResult, agentproto.EditResult{Replacements: -1}, nil)
		}, "edit result out of bounds"},
		{"data in answer to a delete", del, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindData, nil, []byte("x"))
		}, "data frame in answer to delete"},
		{"a delete of an unknown type", del, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindResult, agentproto.DeleteResult{Deleted: 1, Type: "door"}, nil)
		}, "delete result out of bounds"},
		{"a move to no name", move, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindResult, agentproto.MoveResult{To: "", Type: agentproto.TypeFile}, nil)
		}, "move result out of bounds"},
		{"a line read past its total", lines, func(a *agentEnd, req agentproto.Frame) {
			a.send(req.ID, agentproto.KindResult, agentproto.ReadResult{StartLine: 1, EndLine: 5, TotalLines: 2}, nil)
		}, "read result out of bounds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, a := hostileConn(t, func(a *agentEnd) {
				if !a.hello() {
					return
				}
				if req, ok := a.next(); ok {
					tc.answer(a, req)
				}
				a.drain()
			})
			wantBroken(t, c, a, tc.call(c), tc.why)
		})
	}
}
