package tools

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// bins is the agent built for this test run, for the tests that run tools
// against real sandboxes; built on first use, so a run whose tests all skip
// (-short) builds nothing.
var bins testenv.LazyBinaries

func TestMain(m *testing.M) {
	code := m.Run()
	bins.Cleanup()
	os.Exit(code)
}

// rig is the tools served by an MCP server over in-memory transports, on a
// session manager with real sandboxes, and the go-sdk client talking to it.
type rig struct {
	t  *testing.T
	d  *Deps
	ss *mcp.ServerSession
	cs *mcp.ClientSession
	// schemas are the tools' output schemas as the client sees them.
	schemas map[string]*jsonschema.Resolved
}

func newRig(t *testing.T, edit func(*policy.Policy)) *rig {
	t.Helper()
	return newRigWith(t, edit, nil)
}

// newRigWith is newRig with the client's options (a progress handler, say).
func newRigWith(t *testing.T, edit func(*policy.Policy), copts *mcp.ClientOptions) *rig {
	t.Helper()
	cli := testenv.Engine(t)
	instance := fmt.Sprintf("test-tools-%d", time.Now().UnixNano())
	p := policy.Default()
	p.Memory, p.MaxWorkspaceBytes = 256<<20, 64<<20
	if edit != nil {
		edit(&p)
	}
	stateDir := t.TempDir()
	be, err := docker.New(docker.Config{
		Client:      cli,
		Image:       testenv.TestImage(t),
		AgentBinary: bins.Get(t).Agent,
		AgentDir:    filepath.Join(stateDir, "agents"),
		UID:         session.DefaultUID,
		GID:         session.DefaultUID,
		Instance:    instance,
		Egress:      p.Network == policy.NetworkAllowlist,
	})
	if err != nil {
		t.Fatalf("docker.New: %v", err)
	}
	m, err := session.NewManager(context.Background(), session.Options{
		Backend:  be,
		Policy:   p,
		StateDir: stateDir,
		Instance: instance,
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := m.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		left := testenv.Containers(t, cli, docker.LabelInstance, instance)
		testenv.RemoveLabelled(cli, docker.LabelInstance, instance)
		if len(left) > 0 {
			t.Errorf("containers left behind: %v", left)
		}
	})
	r := &rig{t: t, d: &Deps{Policy: p, Sessions: NewSessions(m), Logger: slog.New(slog.DiscardHandler)}, schemas: map[string]*jsonschema.Resolved{}}
	s := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "0"}, nil)
	Register(s, r.d)
	st, ct := mcp.NewInMemoryTransports()
	ctx := context.Background()
	if r.ss, err = s.Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	if r.cs, err = mcp.NewClient(&mcp.Implementation{Name: "c", Version: "0"}, copts).Connect(ctx, ct, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.cs.Close() })
	tools, err := r.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		if tool.OutputSchema == nil {
			continue
		}
		b, _ := tool.OutputSchema.(map[string]any)
		var s jsonschema.Schema
		if err := remarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		if r.schemas[tool.Name], err = s.Resolve(nil); err != nil {
			t.Fatalf("%s: %v", tool.Name, err)
		}
	}
	return r
}

// call calls a tool; a result that is not an error must match the tool's
// output schema.
func (r *rig) call(name string, args map[string]any) *mcp.CallToolResult {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := r.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		r.t.Fatalf("%s: %v", name, err)
	}
	if !res.IsError && r.schemas[name] != nil {
		if err := r.schemas[name].Validate(res.StructuredContent); err != nil {
			r.t.Fatalf("%s: the structured content does not match the output schema: %v\n%v", name, err, res.StructuredContent)
		}
	}
	return res
}

func (r *rig) ok(name string, args map[string]any) map[string]any {
	r.t.Helper()
	res := r.call(name, args)
	if res.IsError {
		r.t.Fatalf("%s(%v) failed: %s", name, args, text(res))
	}
	return res.StructuredContent.(map[string]any)
}

func (r *rig) fails(name string, args map[string]any, code errcode.Code) string {
	r.t.Helper()
	res := r.call(name, args)
	msg := text(res)
	if !res.IsError || !strings.HasPrefix(msg, string(code)+": ") {
		r.t.Fatalf("%s: %q, want a %s error", name, msg, code)
	}
	return msg
}

// hold takes n bytes of the session's share (or, with "", of the total)
// as another call would.
func (r *rig) hold(key string, n int64) *reservation {
	r.t.Helper()
	res, err := r.d.budget.reserve(context.Background(), key, n, 0)
	if err != nil {
		r.t.Fatal(err)
	}
	return res
}

// idle waits until no call holds memory: reservations are given back once
// a response is written, just after the client may have read it.
func (r *rig) idle() {
	r.t.Helper()
	waitFor(r.t, func() bool { total, _, _, _ := r.d.budget.state(""); return total == 0 })
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func remarshal(from, to any) error {
	b, err := json.Marshal(from)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, to)
}

// Every tool's result is its output as the schema describes it, with the
// content rendered once; and every call gives its memory back.
func TestResultsMatchTheirSchemas(t *testing.T) {
	r := newRig(t, nil)
	bin := make([]byte, 300<<10)
	for i := range bin {
		bin[i] = byte(i * 7)
	}
	png := pngOf(t, 20, 10)
	r.ok(NameWriteFile, map[string]any{"path": "t.txt", "content": "héllo <world>\n"})
	r.ok(NameWriteFile, map[string]any{"path": "b.bin", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64"})
	r.ok(NameWriteFile, map[string]any{"path": "i.png", "content": base64.StdEncoding.EncodeToString(png), "encoding": "base64"})

	out := r.ok(NameReadFile, map[string]any{"path": "t.txt"})
	if out["content"] != "héllo <world>\n" || out["encoding"] != "utf-8" {
		t.Fatalf("text read: %v", out)
	}
	res := r.call(NameReadFile, map[string]any{"path": "t.txt"})
	if got := text(res); got != "t.txt: lines 1-1 of 1 (15 bytes of 15)\nhéllo <world>\n" {
		t.Fatalf("text read's text content: %q", got)
	}
	// Without a range, a window of the bytes; with one, up to the file cap.
	out = r.ok(NameReadFile, map[string]any{"path": "b.bin"})
	window := r.d.Policy.MaxOutputBytes / 4 * 3
	if got, _ := base64.StdEncoding.DecodeString(out["content"].(string)); string(got) != string(bin[:window]) || out["encoding"] != "base64" ||
		out["next_byte_offset"] != float64(window) || out["truncated"] != true {
		t.Fatalf("binary read: %d bytes back, %v %v", len(got), out["encoding"], out["next_byte_offset"])
	}
	out = r.ok(NameReadFile, map[string]any{"path": "b.bin", "byte_length": len(bin)})
	if got, _ := base64.StdEncoding.DecodeString(out["content"].(string)); string(got) != string(bin) || out["encoding"] != "base64" {
		t.Fatalf("binary read: %d bytes back, encoding %v", len(got), out["encoding"])
	}
	out = r.ok(NameReadFile, map[string]any{"path": "i.png"})
	if out["media_type"] != "image/png" || out["content"] != "" || out["size"] != float64(len(png)) || !strings.Contains(out["hint"].(string), NameViewImage) {
		t.Fatalf("image read: %v", out)
	}
	out = r.ok(NameReadFile, map[string]any{"path": "i.png", "encoding": "base64"})
	if got, _ := base64.StdEncoding.DecodeString(out["content"].(string)); string(got) != string(png) || out["media_type"] != "image/png" {
		t.Fatalf("image read as base64: %v", out)
	}
	res = r.call(NameViewImage, map[string]any{"path": "i.png"})
	if len(res.Content) != 1 || res.StructuredContent != nil || string(res.Content[0].(*mcp.ImageContent).Data) != string(png) {
		t.Fatalf("view image: %d content blocks, structured %v", len(res.Content), res.StructuredContent)
	}
	r.ok(NameList, map[string]any{"recursive": true})
	snap := r.ok(NameSnapshot, nil)
	r.ok(NameRestore, map[string]any{"id": snap["id"]})
	rr, err := r.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: snap["uri"].(string)})
	if err != nil || len(rr.Contents) != 2 || int64(len(rr.Contents[1].Blob)) != int64(snap["size_bytes"].(float64)) {
		t.Fatalf("snapshot resource: %v, %v", rr, err)
	}
	r.fails(NameReadFile, map[string]any{"path": "missing"}, errcode.NotFound)
	r.idle()
}

// A read waits for memory other calls hold, proceeds when they give it
// back, and otherwise is refused with BUSY; a read asking for less fits
// where a whole file does not.
func TestReadWaitsForMemoryThenIsBusy(t *testing.T) {
	r := newRig(t, nil)
	r.ok(NameWriteFile, map[string]any{"path": "f", "content": strings.Repeat("x", 10000)})
	r.idle()
	share := r.d.Policy.MaxSessionInflightBytes
	small := policy.ReadReserve(4096)
	held := r.hold(budgetKey(r.ss), share-small)

	out := r.ok(NameReadFile, map[string]any{"path": "f", "byte_length": 4096})
	if len(out["content"].(string)) != 4096 {
		t.Fatalf("a small read returned %d bytes", len(out["content"].(string)))
	}
	start := time.Now()
	msg := r.fails(NameReadFile, map[string]any{"path": "f", "byte_length": r.d.Policy.MaxFileBytes}, errcode.Busy)
	if time.Since(start) < reserveWait {
		t.Errorf("refused after %s, before its wait of %s", time.Since(start), reserveWait)
	}
	for _, want := range []string{"this session's calls in flight", "--max-session-inflight-bytes", "retry when other calls have finished", "limit (lines) or byte_length"} {
		if !strings.Contains(msg, want) {
			t.Errorf("BUSY message %q does not say %q", msg, want)
		}
	}

	// A read that waits gets the memory once the other call is done.
	got := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := r.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: NameReadFile, Arguments: map[string]any{"path": "f", "byte_length": r.d.Policy.MaxFileBytes}})
		if err != nil {
			res = &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
		}
		got <- res
	}()
	waitFor(t, func() bool { _, _, _, w := r.d.budget.state(""); return w == 1 })
	held.release()
	if res := <-got; res.IsError {
		t.Fatalf("the waiting read failed once memory was freed: %s", text(res))
	}
	r.idle()

	// The server's total bounds every session together.
	held = r.hold("", r.d.Policy.MaxInflightBytes-small)
	msg = r.fails(NameReadFile, map[string]any{"path": "f", "byte_length": r.d.Policy.MaxFileBytes}, errcode.Busy)
	if !strings.Contains(msg, "the server's calls in flight") || !strings.Contains(msg, "--max-inflight-bytes") {
		t.Errorf("BUSY message %q does not name the server's limit", msg)
	}
	held.release()
}

// Text whose JSON escapes take more than a session may hold is refused as
// too large, with what to do, and holds nothing afterwards.
func TestEscapedTextPastTheShareIsTooLarge(t *testing.T) {
	r := newRig(t, func(p *policy.Policy) { p.MaxSessionInflightBytes = 128 << 20 })
	// 5 MiB of "<" in one line, each six bytes of JSON, in the text and in
	// the structured result: 60 MiB of JSON, more than the session's share
	// once encoded.
	r.ok(NameExec, map[string]any{"argv": []string{"sh", "-c", "head -c 5242880 /dev/zero | tr '\\0' '<' > lt"}})
	msg := r.fails(NameReadFile, map[string]any{"path": "lt", "limit": 1}, errcode.TooLarge)
	if !strings.Contains(msg, "read it in smaller parts with offset and limit, or byte_offset and byte_length") || strings.Contains(msg, "retry") {
		t.Fatalf("TOO_LARGE message %q", msg)
	}
	// A part of it fits.
	out := r.ok(NameReadFile, map[string]any{"path": "lt", "byte_offset": 100, "byte_length": 64 << 10})
	if out["content"] != strings.Repeat("<", 64<<10) {
		t.Fatal("a part of the escaped text came back wrong")
	}
	r.idle()
}

// A write's arguments are reserved before the SDK decodes them: when they
// do not fit, the call is refused at once and the file is not written.
func TestWriteArgumentsAreReservedFirst(t *testing.T) {
	r := newRig(t, nil)
	r.ok(NameWriteFile, map[string]any{"path": "small", "content": "x"}) // the sandbox exists
	r.idle()
	content := base64.StdEncoding.EncodeToString(make([]byte, 256<<10))
	share := r.d.Policy.MaxSessionInflightBytes
	held := r.hold(budgetKey(r.ss), share-policy.ArgumentsReserve(int64(len(content))))
	msg := r.fails(NameWriteFile, map[string]any{"path": "big", "content": content, "encoding": "base64"}, errcode.Busy)
	if !strings.Contains(msg, "a write in parts with append") {
		t.Errorf("BUSY message %q does not say to write in parts", msg)
	}
	held.release()
	r.fails(NameReadFile, map[string]any{"path": "big"}, errcode.NotFound)
	r.ok(NameWriteFile, map[string]any{"path": "big", "content": content, "encoding": "base64"})
	r.idle()
}

// A snapshot resource read reserves its archive and its base64; refused,
// it is a JSON-RPC error whose message starts with BUSY.
func TestSnapshotResourceIsBusyWhenMemoryIsTaken(t *testing.T) {
	r := newRig(t, nil)
	r.ok(NameWriteFile, map[string]any{"path": "f", "content": strings.Repeat("y", 100000)})
	snap := r.ok(NameSnapshot, nil)
	r.idle()
	held := r.hold("", r.d.Policy.MaxInflightBytes-100<<10)
	_, err := r.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: snap["uri"].(string)})
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Code != CodeBusy || !strings.HasPrefix(we.Message, "BUSY: ") {
		t.Fatalf("err = %v, want a JSON-RPC error %d starting with BUSY", err, CodeBusy)
	}
	held.release()
	if _, err := r.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: snap["uri"].(string)}); err != nil {
		t.Fatal(err)
	}
	r.idle()
}
