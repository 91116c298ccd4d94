package tools

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
	"github.com/sandbox-mcp/sandbox-mcp/session"
	"github.com/sandbox-mcp/sandbox-mcp/snapshot"
)

// netFake is a fake sandbox with an egress proxy: it records approvals.
type netFake struct {
	*fakeSandbox
	mu       sync.Mutex
	approved []string
}

func (s *netFake) ApproveHost(host string, port int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.approved = append(s.approved, hostPort(host, port))
	return nil
}
func (s *netFake) ApproveHostForCaller(host string, port int) (time.Time, error) {
	return time.Time{}, errors.New("netFake: no caller scope")
}
func (s *netFake) NarrowNetwork(drop []string, offline bool) error { return nil }
func (s *netFake) NetworkLayers() (session.NetworkLayers, bool) {
	return session.NetworkLayers{}, true
}

type netFakes struct {
	*fakeSandboxes
	sb *netFake
}

func (f netFakes) Sandbox(key, owner string) (Sandbox, error) { return f.sb, nil }

// approvalRig serves the tools with --network-approval for pypi.org over
// in-memory transports, to a go-sdk client on version that answers
// elicitation with elicit (nil: no capability).
func approvalRig(t *testing.T, version string, wait time.Duration, elicit func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error)) (*mcp.ClientSession, *netFake) {
	t.Helper()
	p := policy.Default()
	p.Network, p.AllowHosts = policy.NetworkAllowlist, []string{"files.pythonhosted.org"}
	p.NetworkApproval, p.NetworkApprovalWait = []string{"pypi.org", "*.npmjs.org"}, wait
	snaps, err := snapshot.OpenStore(t.TempDir(), snapshot.Retention{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeSandboxes{snaps: snaps}
	f.sb = &fakeSandbox{f: f}
	sb := &netFake{fakeSandbox: f.sb}
	sb.exec = session.ExecResult{ExitCode: 56, NetworkRefused: []session.NetworkRefusal{
		{Host: "pypi.org", Port: 443, Reason: `"pypi.org:443" is not on this server's --allow-host list; use an allowed host, or ask the operator to add it`, Unlisted: true},
		{Host: "evil.example", Port: 443, Reason: `"evil.example:443" is not on this server's --allow-host list; use an allowed host, or ask the operator to add it`, Unlisted: true},
	}}
	s := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "0"}, &mcp.ServerOptions{
		SupportedProtocolVersions: []string{"2026-07-28", "2025-11-25"},
	})
	Register(s, &Deps{Policy: p, Sessions: SessionsOver(netFakes{f, sb}), Logger: slog.New(slog.DiscardHandler)})
	st, ct := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "0"}, &mcp.ClientOptions{ElicitationHandler: elicit}).
		Connect(ctx, ct, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		ss.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close(); ss.Wait() })
	return cs, sb
}

func execHint(t *testing.T, cs *mcp.ClientSession) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: NameExec, Arguments: map[string]any{"argv": []string{"pip", "install", "x"}}})
	if err != nil {
		t.Fatal(err)
	}
	return structured(t, res)
}

// On 2025-11-25 the person is asked about the approvable host only, and
// allow approves it; no answer within the wait leaves the refusal and the
// call returns.
func TestApprovalAsksWithinTheCall(t *testing.T) {
	var asked atomic.Int64
	var msg atomic.Value
	cs, sb := approvalRig(t, "2025-11-25", time.Minute, func(ctx context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		asked.Add(1)
		msg.Store(r.Params.Message)
		return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": "allow"}}, nil
	})
	out := execHint(t, cs)
	if asked.Load() != 1 || !strings.Contains(msg.Load().(string), "pypi.org:443") || !strings.Contains(msg.Load().(string), "sb-fake") {
		t.Fatalf("asked %d times: %v", asked.Load(), msg.Load())
	}
	if len(sb.approved) != 1 || sb.approved[0] != "pypi.org:443" {
		t.Fatalf("approved %v", sb.approved)
	}
	hint := out["hint"].(string)
	if !strings.Contains(hint, "a person approved pypi.org:443 for this sandbox just now: run the command again") ||
		!strings.Contains(hint, "only the server's operator can allow another host") { // evil.example was not approvable
		t.Fatalf("hint %q", hint)
	}

	start := time.Now()
	cs, sb = approvalRig(t, "2025-11-25", 300*time.Millisecond, func(ctx context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	out = execHint(t, cs)
	if !strings.Contains(out["hint"].(string), "did not answer within 300ms") || len(sb.approved) != 0 || time.Since(start) > 20*time.Second {
		t.Fatalf("no answer: %v (approved %v)", out, sb.approved)
	}
}

// A client without elicitation gets today's refusal, on either revision:
// nobody is asked, nothing is approved.
func TestApprovalNotAsked(t *testing.T) {
	for _, tc := range []struct {
		version string
		elicit  bool
	}{{"2025-11-25", false}, {"2026-07-28", false}} {
		var asked atomic.Int64
		var h func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error)
		if tc.elicit {
			h = func(ctx context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				asked.Add(1)
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": "allow"}}, nil
			}
		}
		cs, sb := approvalRig(t, tc.version, time.Minute, h)
		out := execHint(t, cs)
		if asked.Load() != 0 || len(sb.approved) != 0 || !strings.Contains(out["hint"].(string), "only the server's operator can allow another host") {
			t.Errorf("%s (elicitation %v): asked %d, approved %v, %v", tc.version, tc.elicit, asked.Load(), sb.approved, out)
		}
	}
}

// On 2026-07-28 the question goes back as an input-required result; the
// go-sdk client asks its handler and calls again with the answer, which
// approves the host and releases the result of the command, run once.
func TestApprovalMultiRoundTrip(t *testing.T) {
	for _, tc := range []struct{ decision, want string }{
		{"allow", "a person approved pypi.org:443 for this sandbox just now: run the command again"},
		{"deny", "a person was asked and denied pypi.org:443"},
	} {
		var asked atomic.Int64
		cs, sb := approvalRig(t, "2026-07-28", time.Minute, func(ctx context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked.Add(1)
			if !strings.Contains(r.Params.Message, "pypi.org:443") {
				t.Errorf("message %q", r.Params.Message)
			}
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": tc.decision}}, nil
		})
		if v := cs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
			t.Fatalf("negotiated %s", v)
		}
		out := execHint(t, cs)
		if !strings.Contains(out["hint"].(string), tc.want) || asked.Load() != 1 {
			t.Fatalf("%s: asked %d, %v", tc.decision, asked.Load(), out)
		}
		if approved := len(sb.approved) == 1; approved != (tc.decision == "allow") {
			t.Errorf("%s: approved %v", tc.decision, sb.approved)
		}
		execs := 0
		for _, c := range sb.f.made() {
			if strings.HasPrefix(c, "Exec") {
				execs++
			}
		}
		if execs != 1 {
			t.Errorf("%s: the command ran %d times, want once", tc.decision, execs)
		}
	}
}

// A retry whose requestState the server does not hold (forged, expired or
// used) runs nothing and approves nothing.
func TestApprovalUnknownState(t *testing.T) {
	cs, sb := approvalRig(t, "2026-07-28", time.Minute, nil)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: NameExec, Arguments: map[string]any{"argv": []string{"true"}},
		RequestState: "forged", InputResponses: mcp.InputResponseMap{"approve-0": &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": "allow"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || !strings.Contains(text(res), "no longer waits for") || len(sb.approved) != 0 || len(sb.f.made()) != 0 {
		t.Fatalf("%s; approved %v; calls %v", text(res), sb.approved, sb.f.made())
	}
}
