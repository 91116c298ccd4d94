package httpguard

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// revisionsRig is a guard in front of an MCP server whose one tool says
// the id of the session it ran on, served over real HTTP.
type revisionsRig struct {
	t   *testing.T
	srv *mcp.Server
	ts  *httptest.Server
}

func newRevisionsRig(t *testing.T, maxSessions int) *revisionsRig {
	srv := mcp.NewServer(&mcp.Implementation{Name: "t", Version: "0"}, nil)
	type out struct {
		Session string `json:"session"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "who"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, out, error) {
		return nil, out{Session: req.Session.ID()}, nil
	})
	listen, _ := net.ResolveTCPAddr("tcp", "127.0.0.1:8080")
	g, err := New(Options{Addr: "127.0.0.1:8080", Listen: listen, MaxSessions: maxSessions, SessionsPerCaller: maxSessions,
		CallsPerCaller: 4, MaxRequestBytes: 1 << 20}, srv, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(g.Handler())
	t.Cleanup(ts.Close)
	return &revisionsRig{t: t, srv: srv, ts: ts}
}

// connect connects the go-sdk client at version ("": its preference).
func (r *revisionsRig) connect(version string) (*mcp.ClientSession, error) {
	var opts *mcp.ClientSessionOptions
	if version != "" {
		opts = &mcp.ClientSessionOptions{ProtocolVersion: version}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "0"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: r.ts.URL + Path}, opts)
	if err == nil {
		r.t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

// who calls the tool and returns the id of the session it ran on.
func (r *revisionsRig) who(cs *mcp.ClientSession) string {
	r.t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "who"})
	if err != nil || res.IsError {
		r.t.Fatalf("who: %v %v", err, res)
	}
	return res.StructuredContent.(map[string]any)["session"].(string)
}

// sessions counts the server's sessions, waiting up to a second for the
// count to become want.
func (r *revisionsRig) sessions(want int) int {
	n := 0
	for deadline := time.Now().Add(time.Second); ; {
		n = 0
		for range r.srv.Sessions() {
			n++
		}
		if n == want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *revisionsRig) do(method string, hdr http.Header, body string) *http.Response {
	r.t.Helper()
	req, _ := http.NewRequest(method, r.ts.URL+Path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// TestRevisionsSideBySide: the go-sdk client, which prefers MCP
// 2026-07-28, is served by the stateless handler (no session id; each
// call on a session that is gone once answered, counted against no
// session cap), while a client at 2025-11-25 gets a session as before,
// under the caps; GET and DELETE of 2026-07-28 get 405; a server/discover
// sent without its version header is refused and leaves no session.
func TestRevisionsSideBySide(t *testing.T) {
	r := newRevisionsRig(t, 1)

	old, err := r.connect("2025-11-25")
	if err != nil {
		t.Fatal(err)
	}
	if old.ID() == "" || r.who(old) != old.ID() {
		t.Fatalf("a 2025-11-25 client has no session: %q", old.ID())
	}
	if _, err := r.connect("2025-11-25"); err == nil {
		t.Fatal("a second session passed --max-sessions 1")
	}

	cs, err := r.connect("")
	if err != nil {
		t.Fatalf("a 2026-07-28 client beside a full session cap: %v", err)
	}
	if v := cs.InitializeResult().ProtocolVersion; v != "2026-07-28" || cs.ID() != "" {
		t.Fatalf("the go-sdk client negotiated %q with session %q, want 2026-07-28 without one", v, cs.ID())
	}
	for range 3 {
		if id := r.who(cs); id != "" {
			t.Fatalf("a 2026-07-28 call ran on session %q", id)
		}
	}
	if n := r.sessions(1); n != 1 {
		t.Fatalf("%d sessions after the 2026-07-28 calls, want the 2025-11-25 one alone", n)
	}

	v := http.Header{"Mcp-Protocol-Version": {"2026-07-28"}}
	for _, m := range []string{http.MethodGet, http.MethodDelete} {
		if resp := r.do(m, v, ""); resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s at 2026-07-28: %d, want 405", m, resp.StatusCode)
		}
	}
	old.Close()
	if n := r.sessions(0); n != 0 {
		t.Fatalf("%d sessions once the 2025-11-25 client left", n)
	}

	// A 2026-07-28 request without its version header goes to the
	// handler with sessions, which refuses it (the header is required)
	// and keeps no session of it.
	discover := `{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	if resp := r.do(http.MethodPost, nil, discover); resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Mcp-Session-Id") != "" {
		t.Fatalf("discover without the header: %d, session %q", resp.StatusCode, resp.Header.Get("Mcp-Session-Id"))
	}
	if n := r.sessions(0); n != 0 {
		t.Fatalf("a discover without its header left %d sessions", n)
	}
	if _, err := r.connect("2025-11-25"); err != nil {
		t.Fatalf("the session cap is held by what discover left: %v", err)
	}
}
