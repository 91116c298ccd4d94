package main

// The server through a client nobody here wrote: mcp-go (a test-only
// dependency; the binaries do not link it). It prefers MCP 2026-07-28
// (server/discover, which this server answers), closes its stdio pipes in
// its own order, and, on 2025-11-25, sends its HTTP DELETE without
// per-request headers.

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// mcpgoRun initializes c and runs every tool kind through it, checking
// what a client that reads only structuredContent gets. It returns the
// sandbox id.
func mcpgoRun(t *testing.T, c *mcpclient.Client) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	init, err := c.Initialize(ctx, mcpgo.InitializeRequest{Params: mcpgo.InitializeParams{
		ProtocolVersion: mcpgo.LATEST_PROTOCOL_VERSION,
		ClientInfo:      mcpgo.Implementation{Name: "mcp-go-e2e", Version: "0"},
	}})
	if err != nil {
		t.Fatalf("initialize: %v", err)
	}
	if init.ServerInfo.Name != "sandbox-mcp" || !strings.Contains(init.Instructions, "sandbox://policy") {
		t.Fatalf("initialize: %s %q", init.ServerInfo.Name, init.Instructions)
	}
	call := func(name string, args map[string]any) map[string]any {
		t.Helper()
		res, err := c.CallTool(ctx, mcpgo.CallToolRequest{Params: mcpgo.CallToolParams{Name: name, Arguments: args}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if res.IsError {
			t.Fatalf("%s failed: %v", name, res.Content)
		}
		// mcp-go keeps structuredContent as decoded JSON.
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			t.Fatal(err)
		}
		var out map[string]any
		if err := json.Unmarshal(b, &out); err != nil || out == nil {
			t.Fatalf("%s: structuredContent %s", name, b)
		}
		return out
	}

	out := call("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	if out["exit_code"] != float64(3) || out["stdout"] != "out\n" || out["stderr"] != "err\n" {
		t.Fatalf("exec: %v", out)
	}
	id, _ := out["sandbox"].(string)
	if id == "" {
		t.Fatalf("exec: no sandbox: %v", out)
	}
	if w := call("sandbox_write_file", map[string]any{"path": "dir/a.txt", "content": "first\n"}); w["bytes_written"] != float64(6) {
		t.Fatalf("write: %v", w)
	}
	if r := call("sandbox_read_file", map[string]any{"path": "dir/a.txt"}); r["content"] != "first\n" || r["encoding"] != "utf-8" {
		t.Fatalf("read: %v", r)
	}
	l := call("sandbox_list", map[string]any{"path": "dir"})
	if entries, _ := l["entries"].([]any); len(entries) != 1 || entries[0].(map[string]any)["path"] != "dir/a.txt" {
		t.Fatalf("list: %v", l)
	}
	snap := call("sandbox_snapshot", map[string]any{"label": "mcp-go"})
	snapID, _ := snap["id"].(string)
	if snapID == "" || snap["uri"] != "sandbox://snapshots/"+snapID {
		t.Fatalf("snapshot: %v", snap)
	}
	call("sandbox_write_file", map[string]any{"path": "dir/a.txt", "content": "changed\n"})
	if r := call("sandbox_restore", map[string]any{"id": snapID}); r["id"] != snapID {
		t.Fatalf("restore: %v", r)
	}
	if r := call("sandbox_read_file", map[string]any{"path": "dir/a.txt"}); r["content"] != "first\n" {
		t.Fatalf("read after restore: %v", r)
	}

	rr, err := c.ReadResource(ctx, mcpgo.ReadResourceRequest{Params: mcpgo.ReadResourceParams{URI: snap["uri"].(string)}})
	if err != nil {
		t.Fatalf("read resource: %v", err)
	}
	var record, archive bool
	for _, rc := range rr.Contents {
		switch rc := rc.(type) {
		case mcpgo.TextResourceContents:
			record = strings.Contains(rc.Text, snapID)
		case mcpgo.BlobResourceContents:
			data, err := base64.StdEncoding.DecodeString(rc.Blob)
			if err != nil {
				t.Fatal(err)
			}
			tr := tar.NewReader(bytes.NewReader(data))
			for {
				h, err := tr.Next()
				if err != nil {
					break
				}
				if h.Name == "dir/a.txt" {
					b, _ := io.ReadAll(tr)
					archive = string(b) == "first\n"
				}
			}
		}
	}
	if !record || !archive {
		t.Fatalf("snapshot resource: record %v, archive %v (%d contents)", record, archive, len(rr.Contents))
	}
	return id
}

// TestMCPGoStdio: mcp-go's stdio client runs every tool; its Close ends
// the server, which removes the sandbox and exits cleanly.
func TestMCPGoStdio(t *testing.T) {
	cli := testenv.Engine(t)
	logs := &syncBuffer{}
	c, err := mcpclient.NewStdioMCPClientWithOptions(bins.Get(t).Server, serverEnv(t), serverArgs(t), transport.WithCommandStderrWriter(logs))
	if err != nil {
		t.Fatal(err)
	}
	var id string
	t.Cleanup(func() {
		c.Close()
		if id != "" {
			testenv.RemoveLabelled(cli, docker.LabelSandbox, id)
		}
		if t.Failed() {
			t.Logf("server stderr:\n%s", logs)
		}
	})
	id = mcpgoRun(t, c)
	if err := c.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	testenv.WaitNoContainers(t, cli, docker.LabelSandbox, id, 30*time.Second)
}

// TestMCPGoHTTP: mcp-go's streamable HTTP client on 2025-11-25 (the
// initialize handshake, as clients without 2026-07-28 do), with the token
// in its HTTP client's transport, runs every tool in its session's
// sandbox; its Close (a DELETE) ends the session and its sandbox at once.
func TestMCPGoHTTP(t *testing.T) {
	s := startHTTP(t, httpOpts{env: []string{"SANDBOX_MCP_TOKEN=" + tokenA}})
	tr, err := transport.NewStreamableHTTP(s.url, transport.WithHTTPBasicClient(&http.Client{Transport: bearer{tokenA, http.DefaultTransport}}))
	if err != nil {
		t.Fatal(err)
	}
	c := mcpclient.NewClient(tr, mcpclient.WithLegacyProtocolOnly())
	t.Cleanup(func() { c.Close() })
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	id := mcpgoRun(t, c)
	if v := c.ProtocolVersion(); v != sessionsVersion {
		t.Errorf("mcp-go negotiated %q, want %s", v, sessionsVersion)
	}
	if err := c.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	// Removed by the DELETE, long before --idle-timeout.
	testenv.WaitNoContainers(t, s.cli, docker.LabelSandbox, id, 30*time.Second)
	if !strings.Contains(s.stderr.String(), "session deleted: its sandbox was removed") {
		t.Errorf("no DELETE in the log")
	}
}

// TestMCPGoHTTPSessionless: mcp-go's streamable HTTP client at its own
// preference, 2026-07-28, runs every tool without naming a sandbox on a
// server with --default-sandbox=per-caller: all in its caller's default
// sandbox, which outlives the client and goes when the server stops.
func TestMCPGoHTTPSessionless(t *testing.T) {
	s := startHTTP(t, httpOpts{env: []string{"SANDBOX_MCP_TOKEN=" + tokenA}, args: []string{"--default-sandbox", "per-caller"}})
	c, err := mcpclient.NewStreamableHttpClient(s.url, transport.WithHTTPBasicClient(&http.Client{Transport: bearer{tokenA, http.DefaultTransport}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	id := mcpgoRun(t, c)
	if v := c.ProtocolVersion(); v != sessionless || c.GetSessionId() != "" {
		t.Errorf("mcp-go negotiated %q with session %q, want %s without one", v, c.GetSessionId(), sessionless)
	}
	if err := c.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	time.Sleep(time.Second)
	if n := len(testenv.Containers(t, s.cli, docker.LabelSandbox, id)); n != 1 {
		t.Fatalf("the caller's default sandbox has %d containers after the client left", n)
	}
	if !s.stop(30 * time.Second) {
		t.Fatal("the server did not stop in time")
	}
	testenv.WaitNoContainers(t, s.cli, docker.LabelSandbox, id, 30*time.Second)
}
