package tools

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// connect serves the tools of d over the go-sdk's in-memory transports and
// returns a client session to them; opts, if not nil, are the client
// session's (an older protocol version, say). Both ends close when the
// test ends.
func connect(t *testing.T, d *Deps, opts *mcp.ClientSessionOptions) *mcp.ClientSession {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "0"}, nil)
	Register(s, d)
	st, ct := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "0"}, nil).Connect(ctx, ct, opts)
	if err != nil {
		ss.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close(); ss.Wait() })
	return cs
}

// listTools returns the tools exactly as a client sees them.
func listTools(t *testing.T, p policy.Policy) []*mcp.Tool {
	t.Helper()
	cs := connect(t, &Deps{Policy: p, Sessions: NewSessions(nil), Logger: slog.New(slog.DiscardHandler)}, nil)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return res.Tools
}

// TestGolden keeps each tool's definition (description, annotations, input
// and output schemas) in a golden file, so a schema change shows in review.
// Run `go test ./tools -run TestGolden -update` to accept a change.
func TestGolden(t *testing.T) {
	for _, tool := range listTools(t, policy.Default()) {
		got, err := json.MarshalIndent(tool, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, '\n')
		path := filepath.Join("testdata", tool.Name+".golden.json")
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run with -update to create it)", err)
		}
		if string(got) != string(want) {
			t.Errorf("%s changed; if that is intended, run `go test ./tools -run TestGolden -update` and review the diff\n--- got\n%s", tool.Name, got)
		}
	}
}

func TestToolsAsData(t *testing.T) {
	tools := listTools(t, policy.Default())
	var names []string
	for _, tool := range tools {
		names = append(names, tool.Name)
		if tool.Description == "" || tool.Title == "" {
			t.Errorf("%s: no description or title", tool.Name)
		}
		if tool.InputSchema == nil || (tool.OutputSchema == nil) != (tool.Name == NameViewImage) {
			t.Errorf("%s: missing a schema, or an output schema where the image must show", tool.Name)
		}
		if tool.Annotations == nil {
			t.Fatalf("%s: no annotations", tool.Name)
		}
		a := tool.Annotations
		switch tool.Name {
		case NameReadFile, NameList, NameViewImage:
			if !a.ReadOnlyHint || a.OpenWorldHint == nil || *a.OpenWorldHint {
				t.Errorf("%s: want readOnlyHint and a closed world, got %+v", tool.Name, a)
			}
		case NameWriteFile, NameExec, NameJob, NameEditFile, NameDelete, NameMove:
			if a.ReadOnlyHint || a.DestructiveHint == nil || !*a.DestructiveHint {
				t.Errorf("%s: want destructiveHint, got %+v", tool.Name, a)
			}
		case NameSnapshot:
			if a.ReadOnlyHint || a.DestructiveHint == nil || *a.DestructiveHint {
				t.Errorf("%s: want neither read-only nor destructive, got %+v", tool.Name, a)
			}
		case NameRestore, NameDeleteSnapshot:
			if a.ReadOnlyHint || a.DestructiveHint == nil || !*a.DestructiveHint || !a.IdempotentHint {
				t.Errorf("%s: want destructive and idempotent, got %+v", tool.Name, a)
			}
		case NameCreate:
			if a.ReadOnlyHint || a.DestructiveHint == nil || *a.DestructiveHint || a.IdempotentHint {
				t.Errorf("%s: want neither read-only, destructive nor idempotent, got %+v", tool.Name, a)
			}
		case NameStatus:
			if !a.ReadOnlyHint || !a.IdempotentHint {
				t.Errorf("%s: want read-only and idempotent, got %+v", tool.Name, a)
			}
		case NameEnd:
			if a.ReadOnlyHint || a.DestructiveHint == nil || !*a.DestructiveHint {
				t.Errorf("%s: want destructive, got %+v", tool.Name, a)
			}
		}
		// Every tool that works in a sandbox takes the optional sandbox
		// handle and reports it; deleting a snapshot works on the caller's
		// snapshots, in no sandbox, and takes none.
		in, _ := json.Marshal(tool.InputSchema)
		out, _ := json.Marshal(tool.OutputSchema)
		var inS, outS struct {
			Properties map[string]any `json:"properties"`
			Required   []string       `json:"required"`
		}
		json.Unmarshal(in, &inS)
		json.Unmarshal(out, &outS)
		switch tool.Name {
		case NameCreate, NameStatus, NameEnd:
			// The tools of handles: sandbox_end requires the one it
			// ends, sandbox_create reports the one it made.
			_, takes := inS.Properties["sandbox"]
			if takes != (tool.Name == NameEnd) || slices.Contains(inS.Required, "sandbox") != (tool.Name == NameEnd) {
				t.Errorf("%s: sandbox input %v, required %q", tool.Name, takes, inS.Required)
			}
			if slices.Contains(outS.Required, "sandbox") == (tool.Name == NameStatus) {
				t.Errorf("%s: output requires %q", tool.Name, outS.Required)
			}
			continue
		}
		if tool.Name == NameDeleteSnapshot {
			if _, ok := inS.Properties["sandbox"]; ok {
				t.Errorf("%s: takes a sandbox it does not use", tool.Name)
			}
			if _, ok := outS.Properties["sandbox"]; ok {
				t.Errorf("%s: reports a sandbox it did not work in", tool.Name)
			}
			continue
		}
		if _, ok := inS.Properties["sandbox"]; !ok || slices.Contains(inS.Required, "sandbox") {
			t.Errorf("%s: sandbox must be an optional input", tool.Name)
		}
		if tool.Name != NameViewImage && !slices.Contains(outS.Required, "sandbox") {
			t.Errorf("%s: sandbox must be a required output", tool.Name)
		}
	}
	slices.Sort(names)
	want := []string{NameCreate, NameDelete, NameEditFile, NameEnd, NameExec, NameExpose, NameJob, NameList, NameMove, NameReadFile, NameRestore, NameSnapshot, NameDeleteSnapshot, NameStatus, NameViewImage, NameWriteFile}
	if !slices.Equal(names, want) {
		t.Fatalf("tools = %v, want %v", names, want)
	}
}

// TestExecDescriptionFollowsPolicy: the model learns the allowlist from the
// tool itself.
func TestExecDescriptionFollowsPolicy(t *testing.T) {
	p := policy.Default()
	p.Exec = policy.ExecAllowlist
	p.AllowCmds = []string{"ls", "python3"}
	for _, tool := range listTools(t, p) {
		if tool.Name == NameExec {
			if !contains(tool.Description, "Only these commands may run: ls, python3.") {
				t.Fatalf("description: %s", tool.Description)
			}
			return
		}
	}
	t.Fatal("no exec tool")
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// TestOnlyResultsWithoutAToolErrorGetInvalidArgument: codeErrors goes by the
// error a failed result carries, not by its text. A result the SDK made
// itself (from checking the arguments, before any handler ran) carries a
// plain error and gets INVALID_ARGUMENT, even when its text happens to
// start like a code; a result a tool made carries its *errcode.Error and is
// left as it is.
func TestOnlyResultsWithoutAToolErrorGetInvalidArgument(t *testing.T) {
	through := func(res *mcp.CallToolResult) string {
		t.Helper()
		next := func(context.Context, string, mcp.Request) (mcp.Result, error) { return res, nil }
		out, err := codeErrors(next)(context.Background(), "tools/call", &mcp.CallToolRequest{})
		if err != nil || out != res {
			t.Fatalf("codeErrors returned %v, %v; want the result it was given", out, err)
		}
		return text(res)
	}

	sdk := &mcp.CallToolResult{}
	sdk.SetError(errors.New(`validating "arguments": argv: minItems: got 0, want 1`))
	if got := through(sdk); !strings.HasPrefix(got, `INVALID_ARGUMENT: validating "arguments"`) || !strings.HasSuffix(got, "input schema") {
		t.Errorf("the SDK's argument error reads %q, want INVALID_ARGUMENT and the advice", got)
	}
	lookalike := &mcp.CallToolResult{}
	lookalike.SetError(errors.New("BUSY: text that only looks like a code"))
	if got := through(lookalike); !strings.HasPrefix(got, "INVALID_ARGUMENT: BUSY: ") {
		t.Errorf("an SDK error whose text starts like a code reads %q, want it coded INVALID_ARGUMENT", got)
	}

	tool := &mcp.CallToolResult{}
	tool.SetError(fmt.Errorf("handler: %w", errcode.Errorf(errcode.NotFound, "no such file")))
	if got := through(tool); got != "handler: NOT_FOUND: no such file" {
		t.Errorf("a tool's error was changed to %q", got)
	}
	timeout := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: timedOut(time.Second).Error() + "\npartial output"}}}
	timeout.SetError(timedOut(time.Second))
	if got := through(timeout); !strings.HasPrefix(got, "TIMEOUT: ") || !strings.HasSuffix(got, "partial output") {
		t.Errorf("a tool's own failed result was changed to %q", got)
	}
	ok := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "fine"}}}
	if got := through(ok); got != "fine" {
		t.Errorf("a result that did not fail was changed to %q", got)
	}
}

// TestCancelledCallIsNoToolError: a call whose context ends (the client
// cancelled it) is answered, where the SDK forces an answer, with a
// protocol error carrying CodeRequestCancelled, not an isError result the
// model would read as the command's, and is recorded as cancelled.
func TestCancelledCallIsNoToolError(t *testing.T) {
	var recs []Record
	d := &Deps{Sessions: NewSessions(nil), Logger: slog.New(slog.DiscardHandler), Audit: func(r Record) { recs = append(recs, r) }}
	for name, err := range map[string]error{
		"context":   context.Canceled,
		"coded":     errcode.Errorf(errcode.Unavailable, "the sandbox stopped"),
		"any error": errors.New("agent: stream closed"),
	} {
		recs = nil
		// The call fails as its context has ended already.
		fail := func(_ *Deps, in ExecIn) (ExecIn, error) { return in, err }
		h := wrap(d, NameExec, fail, func(_ *Deps, ctx context.Context, c *call, sb Sandbox, in ExecIn) (*mcp.CallToolResult, ExecOut, error) {
			t.Fatal("run after a failed check")
			return nil, ExecOut{}, nil
		})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		res, _, got := h(ctx, &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{Name: NameExec}}, ExecIn{})
		var wire *jsonrpc.Error
		if res != nil || !errors.As(got, &wire) || wire.Code != CodeRequestCancelled {
			t.Errorf("%s: cancelled call returned %v, %v; want a protocol error with code %d", name, res, got, CodeRequestCancelled)
		}
		if len(recs) != 1 || recs[0].Reason != "cancelled" {
			t.Errorf("%s: audited as %+v, want cancelled", name, recs)
		}
	}
}
