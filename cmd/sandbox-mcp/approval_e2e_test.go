package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// approvalUpstream is a TCP server on every address of this host that
// accepts and closes, reached by the host's name: an unlisted host the
// operator lets a person approve (--network-approval) in the tests below.
func approvalUpstream(t *testing.T) (name string, port int) {
	t.Helper()
	name, _ = os.Hostname()
	up, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return name, up.Addr().(*net.TCPAddr).Port
}

// approvalArgs are the flags of a server whose only allowed host is
// another name, and whose operator lets a person approve target.
func approvalArgs(target, audit string, extra ...string) []string {
	return append([]string{"--network", "allowlist", "--allow-host", "allowed.example:443", "--allow-private-networks",
		"--network-approval", target, "--audit-log", audit}, extra...)
}

// connectThrough has the sandbox send one CONNECT to target through its
// proxy and returns the exec result (the status line in stdout).
func connectThrough(s *server, target string) map[string]any {
	script := fmt.Sprintf(`p=${HTTPS_PROXY#http://}; auth=$(printf %%s "${p%%@*}" | base64); p=${p#*@}; printf 'CONNECT %[1]s HTTP/1.1\r\nHost: %[1]s\r\nProxy-Authorization: Basic %%s\r\n\r\n' "$auth" | nc -w 2 ${p%%:*} ${p##*:} | head -1`, target)
	return s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", script}})
}

// answer is an elicitation handler that answers with action and, for
// accept, decision; it counts the questions and keeps the last message.
type answerer struct {
	action, decision string
	block            bool // never answer: wait until the server gives up
	asked            atomic.Int64
	message          atomic.Value
}

func (a *answerer) handle(ctx context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	a.asked.Add(1)
	a.message.Store(r.Params.Message)
	if a.block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	res := &mcp.ElicitResult{Action: a.action}
	if a.action == "accept" {
		res.Content = map[string]any{"decision": a.decision}
	}
	return res, nil
}

// approvalAudit returns the audit log's network_approval records.
func approvalAudit(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		if rec["kind"] == "network_approval" {
			out = append(out, rec)
		}
	}
	return out
}

func firstDenied(t *testing.T, out map[string]any) map[string]any {
	t.Helper()
	nd, _ := out["network_denied"].([]any)
	if len(nd) == 0 {
		t.Fatalf("no network_denied in %v", out)
	}
	return nd[0].(map[string]any)
}

// checkApproved: the first CONNECT is refused, the person is asked with
// the exact host, allows it, the result says so, and the command run again
// is admitted; the audit log has the question and the answer.
func checkApproved(t *testing.T, s *server, a *answerer, target, audit string) {
	t.Helper()
	out := connectThrough(s, target)
	if !strings.Contains(out["stdout"].(string), "403") {
		t.Fatalf("first CONNECT: %v", out)
	}
	d := firstDenied(t, out)
	if d["approved"] != true || !strings.Contains(out["hint"].(string), "approved "+target+" for this sandbox just now: run the command again") {
		t.Fatalf("result after allow: %v", out)
	}
	if msg, _ := a.message.Load().(string); a.asked.Load() != 1 || !strings.Contains(msg, target) || !strings.Contains(msg, out["sandbox"].(string)) {
		t.Fatalf("asked %d times, last %q", a.asked.Load(), msg)
	}
	out = connectThrough(s, target)
	if !strings.Contains(out["stdout"].(string), "200") || out["network_denied"] != nil {
		t.Fatalf("CONNECT after the approval: %v", out)
	}
	if a.asked.Load() != 1 {
		t.Errorf("asked %d times, want 1", a.asked.Load())
	}
	s.cs.Close()
	recs := approvalAudit(t, audit)
	if len(recs) != 2 || recs[0]["event"] != "question" || recs[1]["event"] != "answer" || recs[1]["answer"] != "approved" ||
		recs[0]["host"] == "" || recs[1]["sandbox"] != out["sandbox"] || recs[1]["pattern"] != target {
		t.Fatalf("audit records: %v", recs)
	}
}

// TestApprovalOverStdio: a person's allow, deny and silence, and a client
// without elicitation, on 2025-11-25 over stdio.
func TestApprovalOverStdio(t *testing.T) {
	name, port := approvalUpstream(t)
	target := fmt.Sprintf("%s:%d", name, port)

	t.Run("allow", func(t *testing.T) {
		audit := filepath.Join(t.TempDir(), "audit.jsonl")
		a := &answerer{action: "accept", decision: "allow"}
		s := startServer(t, serverOpts{args: approvalArgs(target, audit), protocol: "2025-11-25", elicit: a.handle})
		checkApproved(t, s, a, target, audit)
	})

	// On 2026-07-28 the server may not send a request of its own: the
	// question goes back in the tool result as an input request, the
	// go-sdk client asks its handler and calls again with the answer.
	t.Run("allow on 2026-07-28", func(t *testing.T) {
		audit := filepath.Join(t.TempDir(), "audit.jsonl")
		a := &answerer{action: "accept", decision: "allow"}
		s := startServer(t, serverOpts{args: approvalArgs(target, audit), elicit: a.handle})
		if v := s.cs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
			t.Fatalf("negotiated %q, want 2026-07-28", v)
		}
		checkApproved(t, s, a, target, audit)
	})

	t.Run("deny", func(t *testing.T) {
		audit := filepath.Join(t.TempDir(), "audit.jsonl")
		a := &answerer{action: "accept", decision: "deny"}
		s := startServer(t, serverOpts{args: approvalArgs(target, audit), protocol: "2025-11-25", elicit: a.handle})
		for try := range 2 {
			out := connectThrough(s, target)
			if !strings.Contains(out["stdout"].(string), "403") || firstDenied(t, out)["approved"] != nil ||
				!strings.Contains(out["hint"].(string), "a person was asked and denied "+target) {
				t.Fatalf("try %d: %v", try, out)
			}
		}
		if a.asked.Load() != 1 {
			t.Errorf("asked %d times, want 1: a denial is not asked again", a.asked.Load())
		}
		s.cs.Close()
		if recs := approvalAudit(t, audit); len(recs) != 2 || recs[1]["answer"] != "denied" {
			t.Fatalf("audit records: %v", recs)
		}
	})

	t.Run("decline", func(t *testing.T) {
		audit := filepath.Join(t.TempDir(), "audit.jsonl")
		a := &answerer{action: "decline"}
		s := startServer(t, serverOpts{args: approvalArgs(target, audit), protocol: "2025-11-25", elicit: a.handle})
		out := connectThrough(s, target)
		if !strings.Contains(out["hint"].(string), "declined to allow "+target) {
			t.Fatalf("%v", out)
		}
	})

	t.Run("no answer", func(t *testing.T) {
		audit := filepath.Join(t.TempDir(), "audit.jsonl")
		a := &answerer{block: true}
		s := startServer(t, serverOpts{args: approvalArgs(target, audit, "--network-approval-wait", "2s"), protocol: "2025-11-25", elicit: a.handle})
		start := time.Now()
		out := connectThrough(s, target)
		if !strings.Contains(out["hint"].(string), "did not answer within 2s") || firstDenied(t, out)["approved"] != nil {
			t.Fatalf("%v", out)
		}
		if el := time.Since(start); el > 30*time.Second {
			t.Errorf("the call took %v", el)
		}
		if out := connectThrough(s, target); !strings.Contains(out["stdout"].(string), "403") {
			t.Fatalf("after no answer: %v", out)
		}
		s.cs.Close()
		if recs := approvalAudit(t, audit); len(recs) < 2 || recs[1]["answer"] != "timeout" {
			t.Fatalf("audit records: %v", recs)
		}
	})

	t.Run("no capability", func(t *testing.T) {
		audit := filepath.Join(t.TempDir(), "audit.jsonl")
		s := startServer(t, serverOpts{args: approvalArgs(target, audit), protocol: "2025-11-25"})
		out := connectThrough(s, target)
		if !strings.Contains(out["stdout"].(string), "403") || !strings.Contains(out["hint"].(string), "only the server's operator can allow another host") {
			t.Fatalf("%v", out)
		}
		s.cs.Close()
		if recs := approvalAudit(t, audit); len(recs) != 0 {
			t.Fatalf("audit records: %v", recs)
		}
	})

	t.Run("narrowing wins", func(t *testing.T) {
		// The model drops a host a person approved: it is refused again,
		// nobody is asked, and the policy resource shows the live list.
		audit := filepath.Join(t.TempDir(), "audit.jsonl")
		a := &answerer{action: "accept", decision: "allow"}
		s := startServer(t, serverOpts{args: approvalArgs(target, audit), protocol: "2025-11-25", elicit: a.handle})
		if out := connectThrough(s, target); firstDenied(t, out)["approved"] != true {
			t.Fatalf("%v", out)
		}
		live := s.ok("sandbox_network", map[string]any{})
		if fmt.Sprint(live["approved"]) != "["+target+"]" || fmt.Sprint(live["base"]) != "[allowed.example:443]" {
			t.Fatalf("live allowlist: %v", live)
		}
		s.ok("sandbox_network", map[string]any{"drop": []string{target}})
		out := connectThrough(s, target)
		if !strings.Contains(out["stdout"].(string), "403") || !strings.Contains(firstDenied(t, out)["reason"].(string), "dropped") || a.asked.Load() != 1 {
			t.Fatalf("after the drop (asked %d): %v", a.asked.Load(), out)
		}
		pr, err := s.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "sandbox://policy"})
		if err != nil {
			t.Fatal(err)
		}
		var view struct {
			Network struct {
				Approved, Dropped []string
				Offline           bool
			} `json:"sandbox_network"`
		}
		if err := json.Unmarshal([]byte(pr.Contents[0].Text), &view); err != nil {
			t.Fatal(err)
		}
		if len(view.Network.Approved) != 0 || fmt.Sprint(view.Network.Dropped) != "["+target+"]" {
			t.Fatalf("policy resource: %s", pr.Contents[0].Text)
		}
		s.ok("sandbox_network", map[string]any{"offline": true})
		if out := connectThrough(s, "allowed.example:443"); !strings.Contains(firstDenied(t, out)["reason"].(string), "offline") {
			t.Fatalf("offline: %v", out)
		}
	})

	t.Run("not approvable", func(t *testing.T) {
		// A refused host the operator's patterns do not admit: no question.
		audit := filepath.Join(t.TempDir(), "audit.jsonl")
		a := &answerer{action: "accept", decision: "allow"}
		s := startServer(t, serverOpts{args: approvalArgs(target, audit), protocol: "2025-11-25", elicit: a.handle})
		out := connectThrough(s, fmt.Sprintf("%s:%d", name, port+1))
		if !strings.Contains(out["stdout"].(string), "403") || a.asked.Load() != 0 {
			t.Fatalf("asked %d: %v", a.asked.Load(), out)
		}
	})
}

// TestApprovalOverHTTP: the same question and answer over the streamable
// HTTP transport.
func TestApprovalOverHTTP(t *testing.T) {
	name, port := approvalUpstream(t)
	target := fmt.Sprintf("%s:%d", name, port)
	audit := filepath.Join(t.TempDir(), "audit.jsonl")
	h := startHTTP(t, httpOpts{args: approvalArgs(target, audit)})
	a := &answerer{action: "accept", decision: "allow"}
	s, err := h.tryConnectWith("", "2025-11-25", a.handle)
	if err != nil {
		t.Fatal(err)
	}
	checkApproved(t, s, a, target, audit)
}

// TestApprovalOverHTTPSessionless: on 2026-07-28 over HTTP every request
// has a session of its own, so the question goes back as an input request
// and the answer comes on another request: it still reaches the call that
// asked (here in the caller's default sandbox).
func TestApprovalOverHTTPSessionless(t *testing.T) {
	name, port := approvalUpstream(t)
	target := fmt.Sprintf("%s:%d", name, port)
	audit := filepath.Join(t.TempDir(), "audit.jsonl")
	h := startHTTP(t, httpOpts{args: approvalArgs(target, audit, "--default-sandbox", "per-caller")})
	a := &answerer{action: "accept", decision: "allow"}
	s, err := h.tryConnectWith("", "", a.handle)
	if err != nil {
		t.Fatal(err)
	}
	if v := s.cs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
		t.Fatalf("negotiated %q, want 2026-07-28", v)
	}
	checkApproved(t, s, a, target, audit)
}

// connectIn is connectThrough in the named sandbox.
func connectIn(s *server, sandbox, target string) map[string]any {
	script := fmt.Sprintf(`p=${HTTPS_PROXY#http://}; auth=$(printf %%s "${p%%@*}" | base64); p=${p#*@}; printf 'CONNECT %[1]s HTTP/1.1\r\nHost: %[1]s\r\nProxy-Authorization: Basic %%s\r\n\r\n' "$auth" | nc -w 2 ${p%%:*} ${p##*:} | head -1`, target)
	return s.ok("sandbox_exec", map[string]any{"sandbox": sandbox, "argv": []string{"sh", "-c", script}})
}

// TestApprovalPerTemplate: the config file's templates set
// "network-approval" each: a sandbox of the template that lets a person
// approve the host asks and is allowed; one of a template without
// approval (and the default, which has none) is refused without a
// question.
func TestApprovalPerTemplate(t *testing.T) {
	name, port := approvalUpstream(t)
	target := fmt.Sprintf("%s:%d", name, port)
	dir := t.TempDir()
	file := filepath.Join(dir, "config.json")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(`{"templates": {
		"ask": {"network-approval": [%q]},
		"plain": {"memory": "256MiB"}}}`, target)), 0o600); err != nil {
		t.Fatal(err)
	}
	a := &answerer{action: "accept", decision: "allow"}
	s := startServer(t, serverOpts{protocol: "2025-11-25", elicit: a.handle, args: []string{"--config", file,
		"--network", "allowlist", "--allow-host", "allowed.example:443", "--allow-private-networks"}})
	plain := s.ok("sandbox_create", map[string]any{"template": "plain"})["sandbox"].(string)
	if out := connectIn(s, plain, target); !strings.Contains(out["stdout"].(string), "403") || a.asked.Load() != 0 ||
		!strings.Contains(out["hint"].(string), "only the server's operator can allow another host") {
		t.Fatalf("a sandbox of a template without approval (asked %d): %v", a.asked.Load(), out)
	}
	if out := connectThrough(s, target); !strings.Contains(out["stdout"].(string), "403") || a.asked.Load() != 0 {
		t.Fatalf("the default sandbox, without approval (asked %d): %v", a.asked.Load(), out)
	}
	ask := s.ok("sandbox_create", map[string]any{"template": "ask"})["sandbox"].(string)
	out := connectIn(s, ask, target)
	if !strings.Contains(out["stdout"].(string), "403") || firstDenied(t, out)["approved"] != true || a.asked.Load() != 1 {
		t.Fatalf("a sandbox of the template with approval (asked %d): %v", a.asked.Load(), out)
	}
	if out := connectIn(s, ask, target); !strings.Contains(out["stdout"].(string), "200") {
		t.Fatalf("after the approval: %v", out)
	}
	// The approval was for that sandbox only.
	if out := connectIn(s, plain, target); !strings.Contains(out["stdout"].(string), "403") || a.asked.Load() != 1 {
		t.Fatalf("the other template's sandbox after the approval: %v", out)
	}
}

// TestApprovalCallerScope: with --network-approval-caller-scope the
// person answers "allow for all my sandboxes for an hour" in one handle
// sandbox of caller A: A's other handle sandbox reaches the host at once,
// unasked; caller B's sandbox is still refused and B is asked on its own.
func TestApprovalCallerScope(t *testing.T) {
	name, port := approvalUpstream(t)
	target := fmt.Sprintf("%s:%d", name, port)
	audit := filepath.Join(t.TempDir(), "audit.jsonl")
	h := startHTTP(t, httpOpts{args: approvalArgs(target, audit, "--network-approval-caller-scope"),
		env: []string{"SANDBOX_MCP_TOKEN=" + tokenA + "," + tokenB}})
	aa := &answerer{action: "accept", decision: "allow-all-my-sandboxes-1h"}
	a, err := h.tryConnectWith(tokenA, "2025-11-25", aa.handle)
	if err != nil {
		t.Fatal(err)
	}
	ba := &answerer{action: "accept", decision: "deny"}
	b, err := h.tryConnectWith(tokenB, "2025-11-25", ba.handle)
	if err != nil {
		t.Fatal(err)
	}
	one := a.ok("sandbox_create", map[string]any{"label": "one"})["sandbox"].(string)
	two := a.ok("sandbox_create", map[string]any{"label": "two"})["sandbox"].(string)
	out := connectIn(a, one, target)
	if !strings.Contains(out["stdout"].(string), "403") || firstDenied(t, out)["approved"] != true ||
		!strings.Contains(out["hint"].(string), "for all this caller's sandboxes just now, until ") {
		t.Fatalf("the answer for all the caller's sandboxes: %v", out)
	}
	if msg, _ := aa.message.Load().(string); !strings.Contains(msg, "allow-all-my-sandboxes-1h") {
		t.Fatalf("the question does not offer the third answer: %q", msg)
	}
	for _, sb := range []string{one, two} {
		if out := connectIn(a, sb, target); !strings.Contains(out["stdout"].(string), "200") {
			t.Fatalf("caller A's sandbox %s after the grant: %v", sb, out)
		}
	}
	if aa.asked.Load() != 1 {
		t.Errorf("A was asked %d times, want 1", aa.asked.Load())
	}
	live := a.ok("sandbox_network", map[string]any{"sandbox": two})
	if fmt.Sprint(live["caller_approved"]) == "[]" || !strings.Contains(fmt.Sprint(live["caller_approved"]), target+" until ") {
		t.Errorf("sandbox_network of A's other sandbox: %v", live)
	}
	// Caller B: refused, asked, denied, still refused.
	bsb := b.ok("sandbox_create", map[string]any{})["sandbox"].(string)
	for range 2 {
		if out := connectIn(b, bsb, target); !strings.Contains(out["stdout"].(string), "403") {
			t.Fatalf("caller B's sandbox: %v", out)
		}
	}
	if ba.asked.Load() != 1 {
		t.Errorf("B was asked %d times, want 1", ba.asked.Load())
	}
	a.cs.Close()
	b.cs.Close()
	recs := approvalAudit(t, audit)
	if len(recs) < 2 || recs[1]["answer"] != "approved_for_caller" || !strings.Contains(fmt.Sprint(recs[1]["detail"]), "until ") {
		t.Fatalf("audit records: %v", recs)
	}
}
