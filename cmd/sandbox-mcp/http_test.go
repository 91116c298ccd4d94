package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/cmd/sandbox-mcp/internal/httpguard"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// Tokens of the HTTP tests' callers (never real secrets).
const (
	tokenA = "test-token-alpha-5b0c2f7e9d1a"
	tokenB = "test-token-bravo-8e3d6a1c4f2b"
)

// initializeBody is a legacy initialize request, as a 2025-11-25 client
// sends it.
const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`

// httpServer is a sandbox-mcp process serving streamable HTTP.
type httpServer struct {
	t      *testing.T
	cmd    *exec.Cmd
	base   string // http://host:port
	url    string // base + "/mcp"
	port   string
	stderr *syncBuffer
	cli    *client.Client
	exited chan struct{}

	mu      sync.Mutex
	clients []*server // every client session, for the final check
}

type httpOpts struct {
	bin  string // default bins.Get(t).Server
	addr string // default 127.0.0.1:0
	args []string
	env  []string
}

// serverArgs are the arguments every test server gets: the test image, a
// fresh state directory, small sandboxes. Its stop ends every sandbox,
// handles included (--end-handles-at-stop), so that a test leaves nothing
// running for a lease.
func serverArgs(t *testing.T) []string {
	return []string{"--image", testenv.TestImage(t), "--state-dir", t.TempDir(), "--agent-bin", bins.Get(t).Agent,
		"--memory", "256MiB", "--max-workspace-bytes", "64MiB", "--log-level", "debug", "--end-handles-at-stop"}
}

// serverEnv is the environment of a test server: only what it needs.
func serverEnv(t *testing.T, extra ...string) []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		env = append(env, "DOCKER_HOST="+h)
	}
	return append(env, extra...)
}

var servingURL = regexp.MustCompile(`msg="serving MCP over streamable HTTP" url=(http://(\S+)/mcp)`)

// startHTTP runs the built binary with --http and waits until it serves.
// At cleanup it stops the server with SIGTERM and checks that every sandbox
// its clients saw is gone.
func startHTTP(t *testing.T, o httpOpts) *httpServer {
	t.Helper()
	addr := o.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	args := append(append([]string{"--http", addr}, serverArgs(t)...), o.args...) // skips under -short before the build
	bin := o.bin
	if bin == "" {
		bin = bins.Get(t).Server
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = serverEnv(t, o.env...)
	s := &httpServer{t: t, cmd: cmd, stderr: &syncBuffer{}, cli: testenv.Engine(t), exited: make(chan struct{})}
	cmd.Stderr = s.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		s.stop(30 * time.Second)
		if t.Failed() {
			t.Logf("server stderr:\n%s", s.stderr)
		}
		s.mu.Lock()
		clients := slices.Clone(s.clients)
		s.mu.Unlock()
		for _, c := range clients {
			c.checkNoSandboxes(20 * time.Second)
		}
		if strings.Contains(s.stderr.String(), "DATA RACE") {
			t.Errorf("the server reported a data race:\n%s", s.stderr)
		}
	})
	deadline := time.Now().Add(90 * time.Second)
	for {
		if m := servingURL.FindStringSubmatch(s.stderr.String()); m != nil {
			s.url, s.base = m[1], strings.TrimSuffix(m[1], "/mcp")
			_, s.port, _ = net.SplitHostPort(m[2])
			return s
		}
		select {
		case <-s.exited:
			t.Fatalf("the server exited before serving:\n%s", s.stderr)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not start serving:\n%s", s.stderr)
		}
	}
}

// stop sends SIGTERM and waits for the exit, killing the process after
// timeout. It reports whether the server exited by itself in time.
func (s *httpServer) stop(timeout time.Duration) bool {
	select {
	case <-s.exited:
		return true
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		return true
	case <-time.After(timeout):
		s.cmd.Process.Kill()
		<-s.exited
		return false
	}
}

// bearer adds a token to every request of a client.
type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

// sessionsVersion is the MCP version the HTTP tests' clients ask for
// unless a test says otherwise: the newest with protocol sessions, since
// these tests are about a session's own sandbox and the session caps. The
// go-sdk client on its own prefers 2026-07-28, which has no sessions (see
// revisions_e2e_test.go).
const sessionsVersion = "2025-11-25"

// connect opens an MCP session as the caller with token ("" for none),
// through the go-sdk client at sessionsVersion.
func (s *httpServer) connect(token string) *server {
	s.t.Helper()
	return s.connectAt(token, sessionsVersion)
}

// connectAt is connect asking for protocol version ("": the SDK's
// preference).
func (s *httpServer) connectAt(token, version string) *server {
	s.t.Helper()
	c, err := s.tryConnectAt(token, version)
	if err != nil {
		s.t.Fatalf("connect: %v\nserver stderr:\n%s", err, s.stderr)
	}
	return c
}

func (s *httpServer) tryConnect(token string) (*server, error) {
	return s.tryConnectAt(token, sessionsVersion)
}

// tryConnectAt is tryConnect asking for protocol version ("": the SDK's).
func (s *httpServer) tryConnectAt(token, version string) (*server, error) {
	return s.tryConnectWith(token, version, nil)
}

// tryConnectWith is tryConnectAt with a client that answers elicitation
// requests with elicit (nil: a client without the capability).
func (s *httpServer) tryConnectWith(token, version string, elicit func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error)) (*server, error) {
	hc := &http.Client{Transport: http.DefaultTransport}
	if token != "" {
		hc.Transport = bearer{token, http.DefaultTransport}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := &server{t: s.t, stderr: s.stderr, cli: s.cli, sandboxes: map[string]bool{}}
	opts := &mcp.ClientOptions{ProgressNotificationHandler: func(ctx context.Context, r *mcp.ProgressNotificationClientRequest) { c.progressed(r) },
		ElicitationHandler: elicit}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "http-e2e", Version: "0"}, opts).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.url, HTTPClient: hc}, copts(version))
	if err != nil {
		return nil, err
	}
	c.cs = cs
	s.mu.Lock()
	s.clients = append(s.clients, c)
	s.mu.Unlock()
	s.t.Cleanup(func() { cs.Close() })
	return c, nil
}

// reply is a raw HTTP response, its body read.
type reply struct {
	status int
	header http.Header
	body   string
}

// do sends one raw request to /mcp (or to path, if it starts with "/").
// hdr values replace the defaults: a JSON POST accepting JSON and SSE.
func (s *httpServer) do(method, path string, hdr http.Header, body string) reply {
	s.t.Helper()
	if path == "" {
		path = "/mcp"
	}
	req, err := http.NewRequest(method, s.base+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range hdr {
		if strings.EqualFold(k, "Host") {
			req.Host = v[0]
			continue
		}
		req.Header[http.CanonicalHeaderKey(k)] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	// An SSE answer stays open on GET: read what is there, briefly.
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return reply{resp.StatusCode, resp.Header, string(b)}
}

func bearerHeader(token string) http.Header { return http.Header{"Authorization": {"Bearer " + token}} }

func with(h http.Header, kv ...string) http.Header {
	out := h.Clone()
	if out == nil {
		out = http.Header{}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[http.CanonicalHeaderKey(kv[i])] = append(out[http.CanonicalHeaderKey(kv[i])], kv[i+1])
	}
	return out
}

// initialize opens a session with a raw request and returns its id.
func (s *httpServer) initialize(h http.Header) string {
	s.t.Helper()
	r := s.do(http.MethodPost, "", h, initializeBody)
	id := r.header.Get("Mcp-Session-Id")
	if r.status != http.StatusOK || id == "" {
		s.t.Fatalf("initialize: %d %q %s", r.status, id, r.body)
	}
	return id
}

// TestHTTPAuth covers the HTTP cases of docs/attack-cases.md (as do the
// "HTTP case" numbers below) 1, 2, 10, 12, 13, 18 and 19, and /healthz.
func TestHTTPAuth(t *testing.T) {
	s := startHTTP(t, httpOpts{env: []string{"SANDBOX_MCP_TOKEN=" + tokenA}})
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+tokenA))
	for _, tc := range []struct {
		name string
		path string
		hdr  http.Header
	}{
		{"no Authorization", "", nil},
		{"wrong token", "", bearerHeader("not-the-token-0123456789")},
		{"token prefix", "", bearerHeader(tokenA[:len(tokenA)-1])},
		{"empty bearer", "", http.Header{"Authorization": {"Bearer "}}},
		{"Basic", "", http.Header{"Authorization": {basic}}},
		{"token in the query", "/mcp?access_token=" + tokenA, nil},
		{"two Authorization headers", "", http.Header{"Authorization": {"Bearer " + tokenA, "Bearer " + tokenA}}},
		{"token and wrong token", "", http.Header{"Authorization": {"Bearer " + tokenA, "Bearer wrong-token-0123456789"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
				r := s.do(method, tc.path, tc.hdr, initializeBody)
				if r.status != http.StatusUnauthorized {
					t.Errorf("%s: status %d, want 401: %s", method, r.status, r.body)
				}
				if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("%s: WWW-Authenticate %q", method, r.header.Get("WWW-Authenticate"))
				}
				if r.header.Get("Mcp-Session-Id") != "" {
					t.Errorf("%s: a session was created", method)
				}
				if strings.Contains(r.body, tokenA) {
					t.Errorf("%s: the answer holds the token: %s", method, r.body)
				}
			}
		})
	}

	// With the token: a session, and the SDK's own checks behind ours.
	id := s.initialize(bearerHeader(tokenA))
	if got := s.do(http.MethodPost, "", bearerHeader(tokenA), initializeBody); got.header.Get("WWW-Authenticate") != "" {
		t.Errorf("a successful answer carries WWW-Authenticate")
	}
	for _, tc := range []struct {
		name string
		hdr  http.Header
		body string
		want int
	}{
		// #10: the server never adopts a client's session id.
		{"made-up session id", with(bearerHeader(tokenA), "Mcp-Session-Id", "ATTACKERCHOSENSESSIONID123"), `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, http.StatusNotFound},
		// #18
		{"text/plain body", with(bearerHeader(tokenA), "Content-Type", "text/plain", "Mcp-Session-Id", id), `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, http.StatusUnsupportedMediaType},
		{"no text/event-stream in Accept", http.Header{"Authorization": {"Bearer " + tokenA}, "Accept": {"application/json"}, "Mcp-Session-Id": {id}}, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, http.StatusBadRequest},
		// #19
		{"unsupported protocol version", with(bearerHeader(tokenA), "Mcp-Session-Id", id, "MCP-Protocol-Version", "1999-01-01"), `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, http.StatusBadRequest},
		{"the session works", with(bearerHeader(tokenA), "Mcp-Session-Id", id, "MCP-Protocol-Version", "2025-11-25"), `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, http.StatusOK},
	} {
		if r := s.do(http.MethodPost, "", tc.hdr, tc.body); r.status != tc.want {
			t.Errorf("%s: status %d, want %d: %s", tc.name, r.status, tc.want, r.body)
		}
	}

	// A session this process does not hold (its replica is gone, or the
	// server restarted) is a 404, so clients start a new session, with a
	// body that says why and what to do. The body is not read (see
	// TestHTTPUnknownSessionRefusedBeforeItsBody), so the error's id is null.
	if r := s.do(http.MethodPost, "", with(bearerHeader(tokenA), "Mcp-Session-Id", "SESSIONOFAREPLICATHATDIED"), `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`); r.status != http.StatusNotFound ||
		!strings.Contains(r.body, "UNAVAILABLE: this server does not hold that MCP session") || !strings.Contains(r.body, "initialize again") ||
		!strings.Contains(r.body, `"id":null`) {
		t.Errorf("unknown session: status %d, want 404 with UNAVAILABLE and to initialize again: %s", r.status, r.body)
	}

	// #13: DELETE ends a session; its id is dead afterwards.
	if r := s.do(http.MethodDelete, "", with(bearerHeader(tokenA), "Mcp-Session-Id", id), ""); r.status != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", r.status, r.body)
	}
	if r := s.do(http.MethodPost, "", with(bearerHeader(tokenA), "Mcp-Session-Id", id), `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`); r.status != http.StatusNotFound {
		t.Fatalf("a deleted session answered %d", r.status)
	}

	// #12: session ids are distinct, long and visible ASCII.
	ids := map[string]bool{}
	visible := regexp.MustCompile(`^[\x21-\x7e]{22,}$`)
	for range 200 {
		id := s.initialize(bearerHeader(tokenA))
		if ids[id] || !visible.MatchString(id) {
			t.Fatalf("session id %q: repeated or not ≥22 visible ASCII characters (≥128 bits)", id)
		}
		ids[id] = true
		s.do(http.MethodDelete, "", with(bearerHeader(tokenA), "Mcp-Session-Id", id), "")
	}

	// /healthz answers probes without a token and says nothing more.
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		r := s.do(method, "/healthz", http.Header{"Host": {"probe.internal"}}, "")
		if r.status != http.StatusOK || (method == http.MethodGet && r.body != "ok\n") {
			t.Errorf("%s /healthz: %d %q", method, r.status, r.body)
		}
	}
	if r := s.do(http.MethodPost, "/healthz", nil, ""); r.status != http.StatusMethodNotAllowed {
		t.Errorf("POST /healthz: %d", r.status)
	}
	if r := s.do(http.MethodGet, "/", bearerHeader(tokenA), ""); r.status != http.StatusNotFound {
		t.Errorf("GET /: %d", r.status)
	}
	if strings.Contains(s.stderr.String(), tokenA) {
		t.Errorf("the log holds the token")
	}
}

// TestHTTPHostAndOrigin covers HTTP cases 4 and 6–9: a bad Host
// or Origin gets 403 on every method, before authentication.
func TestHTTPHostAndOrigin(t *testing.T) {
	s := startHTTP(t, httpOpts{
		env:  []string{"SANDBOX_MCP_TOKEN=" + tokenA},
		args: []string{"--allow-origin", "https://tools.example", "--http-allow-host", "mcp-proxy.example"},
	})
	id := s.initialize(bearerHeader(tokenA))
	sess := with(bearerHeader(tokenA), "Mcp-Session-Id", id)
	for _, tc := range []struct {
		name string
		hdr  http.Header
	}{
		{"Host evil.com", with(sess, "Host", "evil.com")},
		{"Host evil.com:80", with(sess, "Host", "evil.com:80")},
		{"Host localhost.evil.com", with(sess, "Host", "localhost.evil.com:"+s.port)},
		{"Host 127.0.0.1.nip.io", with(sess, "Host", "127.0.0.1.nip.io:"+s.port)},
		{"Origin evil", with(sess, "Origin", "https://evil.example")},
		{"Origin evil, no token", http.Header{"Origin": {"https://evil.example"}, "Mcp-Session-Id": {id}}},
		{"Origin null", with(sess, "Origin", "null")},
		{"Origin of a look-alike", with(sess, "Origin", "https://tools.example.evil.net")},
		{"Origin of another port", with(sess, "Origin", "http://127.0.0.1:1")},
		{"two Origins", with(sess, "Origin", "https://tools.example", "Origin", "https://evil.example")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
				body := ""
				if method == http.MethodPost {
					body = `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
				}
				r := s.do(method, "", tc.hdr, body)
				if r.status != http.StatusForbidden {
					t.Errorf("%s: status %d, want 403: %s", method, r.status, r.body)
				}
			}
		})
	}
	// None of those DELETEs ended the session.
	for _, tc := range []struct {
		name string
		hdr  http.Header
	}{
		{"no Origin (a CLI client)", sess},
		{"an allowed Origin", with(sess, "Origin", "https://tools.example")},
		{"the server's own origin", with(sess, "Origin", "http://127.0.0.1:"+s.port)},
		{"Host localhost", with(sess, "Host", "localhost:"+s.port)},
		{"Host of the reverse proxy", with(sess, "Host", "MCP-Proxy.example.")},
	} {
		r := s.do(http.MethodPost, "", tc.hdr, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
		if r.status != http.StatusOK || !strings.Contains(r.body, "sandbox_exec") {
			t.Errorf("%s: status %d: %.200s", tc.name, r.status, r.body)
		}
	}
}

// nonLoopbackIPv4 returns an address of this machine that is not loopback,
// preferring one that is not a Docker bridge.
func nonLoopbackIPv4(t *testing.T) string {
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				if strings.HasPrefix(ifc.Name, "docker") || strings.HasPrefix(ifc.Name, "br-") {
					found = append(found, ipn.IP.String())
				} else {
					found = append([]string{ipn.IP.String()}, found...)
				}
			}
		}
	}
	if len(found) == 0 {
		t.Fatal("this machine has no non-loopback IPv4 address to test a network listener with")
	}
	return found[0]
}

// TestHTTPNonLoopback covers HTTP case 5, and the refusal to
// serve a network address without a token.
func TestHTTPNonLoopback(t *testing.T) {
	ip := nonLoopbackIPv4(t)

	args := append([]string{"--http", ip + ":0"}, serverArgs(t)...) // skips under -short before the build
	cmd := exec.Command(bins.Get(t).Server, args...)
	cmd.Env = serverEnv(t)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--token") || strings.Contains(string(out), "serving MCP") {
		t.Fatalf("a server on %s without a token: %v\n%s", ip, err, out)
	}

	s := startHTTP(t, httpOpts{addr: ip + ":0", args: []string{"--token", tokenA}})
	for _, host := range []string{"attacker.rebind.example:" + s.port, "localhost.attacker.example", ip + ".nip.io"} {
		if r := s.do(http.MethodPost, "", with(bearerHeader(tokenA), "Host", host), initializeBody); r.status != http.StatusForbidden {
			t.Errorf("Host %s: %d, want 403", host, r.status)
		}
	}
	s.initialize(bearerHeader(tokenA)) // Host is ip:port
	if r := s.do(http.MethodPost, "", nil, initializeBody); r.status != http.StatusUnauthorized {
		t.Errorf("no token on a network address: %d", r.status)
	}

	// HTTP case 20 with the default --network=none: a sandbox has no network
	// interface but its own loopback, so no address of this machine (the
	// server's included) is reachable from it. With --network=allowlist
	// the proxy's tests cover it.
	c := s.connect(tokenA)
	got := c.ok("sandbox_exec", map[string]any{"argv": []string{"ls", "/sys/class/net"}})
	if got["stdout"] != "lo\n" {
		t.Fatalf("a sandbox has network interfaces: %v", got)
	}
}

// TestHTTPCallers: sessions are separate, sandboxes and snapshots belong to
// their caller (HTTP cases 11, 14, 21), and the audit log records calls.
func TestHTTPCallers(t *testing.T) {
	auditPath := t.TempDir() + "/audit.jsonl"
	stateDir := t.TempDir()
	const envSecret = "env-secret-value-4e1f"
	s := startHTTP(t, httpOpts{
		env:  []string{"SANDBOX_MCP_TOKEN=" + tokenA + "," + tokenB, "GIVEN=" + envSecret},
		args: []string{"--audit-log", auditPath, "--env", "GIVEN", "--state-dir", stateDir},
	})
	a := s.connect(tokenA)
	if v := a.cs.InitializeResult().ProtocolVersion; v != sessionsVersion {
		t.Fatalf("the client negotiated %q, want %s", v, sessionsVersion)
	}
	a2 := s.connect(tokenA)
	b := s.connect(tokenB)

	outA := a.ok("sandbox_write_file", map[string]any{"path": "mine.txt", "content": "alpha"})
	idA := outA["sandbox"].(string)
	idA2 := a2.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})["sandbox"].(string)
	idB := b.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})["sandbox"].(string)
	if idA == idA2 || idA == idB || idA2 == idB {
		t.Fatalf("sessions share a sandbox: %s %s %s", idA, idA2, idB)
	}
	containers := map[string]bool{}
	for _, id := range []string{idA, idA2, idB} {
		c := testenv.Containers(t, s.cli, docker.LabelSandbox, id)
		if len(c) != 1 {
			t.Fatalf("sandbox %s has containers %v", id, c)
		}
		containers[c[0]] = true
	}
	if len(containers) != 3 {
		t.Fatalf("sessions share containers: %v", containers)
	}

	// Separate workspaces, even for one caller's two sessions.
	a2.fails("sandbox_read_file", map[string]any{"path": "mine.txt"}, "NOT_FOUND")
	b.fails("sandbox_read_file", map[string]any{"path": "mine.txt"}, "NOT_FOUND")
	// A caller may name its own sandbox from another session...
	if r := a2.ok("sandbox_read_file", map[string]any{"path": "mine.txt", "sandbox": idA}); r["content"] != "alpha" || r["sandbox"] != idA {
		t.Fatalf("reading the caller's other sandbox: %v", r)
	}
	// ...another caller may not (HTTP case 14): NOT_FOUND, as if it did not exist.
	msg := b.fails("sandbox_read_file", map[string]any{"path": "mine.txt", "sandbox": idA}, "NOT_FOUND")
	b.fails("sandbox_exec", map[string]any{"argv": []string{"true"}, "sandbox": idA}, "NOT_FOUND")
	if strings.Contains(msg, "alpha") {
		t.Fatalf("the error shows the other caller's data: %s", msg)
	}

	// Snapshots: the caller's own are readable, another's are not found.
	snap := a.ok("sandbox_snapshot", map[string]any{"label": "a"})
	uri := snap["uri"].(string)
	ctx := context.Background()
	if _, err := a2.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri}); err != nil {
		t.Fatalf("the caller cannot read its snapshot: %v", err)
	}
	if _, err := b.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("another caller read the snapshot: %v", err)
	}
	// Nor restore, delete or list it: to another caller it does not exist.
	b.fails("sandbox_restore", map[string]any{"id": snap["id"]}, "NOT_FOUND")
	b.fails("sandbox_snapshot_delete", map[string]any{"id": snap["id"]}, "NOT_FOUND")
	lr, err := b.cs.ListResources(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range lr.Resources {
		if r.URI == uri {
			t.Fatal("another caller lists the snapshot")
		}
	}
	if _, err := a2.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri}); err != nil {
		t.Fatalf("another caller's delete removed the snapshot: %v", err)
	}

	// HTTP case 11: a session id with another caller's token is refused, and
	// a DELETE by another caller leaves the session and its sandbox alone.
	if r := s.do(http.MethodPost, "", with(bearerHeader(tokenB), "Mcp-Session-Id", a.cs.ID()), `{"jsonrpc":"2.0","id":9,"method":"tools/list"}`); r.status != http.StatusForbidden {
		t.Errorf("another caller used the session: %d %s", r.status, r.body)
	}
	if r := s.do(http.MethodDelete, "", with(bearerHeader(tokenB), "Mcp-Session-Id", a.cs.ID()), ""); r.status != http.StatusForbidden {
		t.Errorf("another caller deleted the session: %d %s", r.status, r.body)
	}
	if len(testenv.Containers(t, s.cli, docker.LabelSandbox, idA)) != 1 {
		t.Fatal("another caller's DELETE removed the sandbox")
	}
	a.ok("sandbox_read_file", map[string]any{"path": "mine.txt"})

	// HTTP case 21: the token is nowhere in a sandbox, in results or in the log.
	// (PID 1 runs as root: its environment is out of the sandbox user's reach.)
	env := a.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "env; tr '\\0' '\\n' </proc/1/environ 2>&1 || echo unreadable"}})
	for _, tok := range []string{tokenA, tokenB} {
		if strings.Contains(fmt.Sprint(env), tok) {
			t.Fatalf("a sandbox sees the token:\n%v", env)
		}
		if strings.Contains(s.stderr.String(), tok) {
			t.Fatalf("the log holds a token")
		}
	}
	if !strings.Contains(env["stdout"].(string), "GIVEN="+envSecret) {
		t.Fatalf("--env did not reach the sandbox: %v", env["stdout"])
	}
	a.fails("sandbox_exec", map[string]any{"argv": []string{"no-such-program"}}, "NOT_FOUND")

	// The audit log: one JSON line per call, right fields, no secret.
	s.stop(30 * time.Second)
	raw, err := os.ReadFile(auditPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{tokenA, tokenB, envSecret} {
		if strings.Contains(string(raw), secret) || strings.Contains(s.stderr.String(), secret) {
			t.Fatalf("a secret is in the audit log or the server log")
		}
	}
	var recs []map[string]any
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		if m["kind"] == "tool_call" { // the server's start and stop have records too
			recs = append(recs, m)
		}
	}
	if len(recs) != 14 {
		t.Errorf("%d audit records for 14 tool calls:\n%s", len(recs), raw)
	}
	find := func(pred func(map[string]any) bool) map[string]any {
		for _, m := range recs {
			if pred(m) {
				return m
			}
		}
		t.Fatalf("no such audit record in:\n%s", raw)
		return nil
	}
	allowed := find(func(m map[string]any) bool {
		return m["tool"] == "sandbox_exec" && m["sandbox"] == idA && m["decision"] == "allow"
	})
	if allowed["kind"] != "tool_call" || allowed["caller"] != httpguard.CallerID(tokenA) || allowed["session"] != a.cs.ID() ||
		allowed["decision"] != "allow" || allowed["exit_code"] != float64(0) || allowed["bytes"].(float64) <= 0 ||
		!strings.HasPrefix(allowed["arg_digest"].(string), "hmac-sha256:") {
		t.Errorf("allowed exec record: %v", allowed)
	}
	// The operator checks a digest with the server's key.
	written := find(func(m map[string]any) bool { return m["tool"] == "sandbox_write_file" && m["sandbox"] == idA })
	check := exec.Command(bins.Get(t).Server, "audit", "digest", "--state-dir", stateDir)
	check.Env = serverEnv(t)
	check.Stdin = strings.NewReader(`{"content": "alpha", "path": "mine.txt"}` + "\n")
	if out, err := check.Output(); err != nil || strings.TrimSpace(string(out)) != written["arg_digest"] {
		t.Errorf("audit digest of the write's arguments = %q (%v), the record has %v", out, err, written["arg_digest"])
	}
	if _, err := time.Parse(time.RFC3339Nano, allowed["time"].(string)); err != nil {
		t.Errorf("time: %v", err)
	}
	if _, ok := allowed["duration_ms"].(float64); !ok {
		t.Errorf("no duration: %v", allowed)
	}
	denied := find(func(m map[string]any) bool {
		return m["caller"] == httpguard.CallerID(tokenB) && m["tool"] == "sandbox_exec" && m["decision"] == "deny"
	})
	if !strings.HasPrefix(denied["reason"].(string), "NOT_FOUND: ") || denied["session"] != b.cs.ID() {
		t.Errorf("denied exec record: %v", denied)
	}
	if httpguard.CallerID(tokenA) == httpguard.CallerID(tokenB) || strings.Contains(httpguard.CallerID(tokenA), tokenA[:8]) {
		t.Errorf("caller ids: %s %s", httpguard.CallerID(tokenA), httpguard.CallerID(tokenB))
	}
}

// TestHTTPDeleteEndsCalls: a DELETE during a long command returns at once,
// the command ends, and the container goes soon after (the SDK alone would
// wait for the command).
func TestHTTPDeleteEndsCalls(t *testing.T) {
	s := startHTTP(t, httpOpts{})
	c := s.connect("")
	id := c.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})["sandbox"].(string)
	done := c.running(context.Background(), "echo started; exec sleep 60")
	start := time.Now()
	r := s.do(http.MethodDelete, "", http.Header{"Mcp-Session-Id": {c.cs.ID()}}, "")
	took := time.Since(start)
	if r.status != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", r.status, r.body)
	}
	if took > 15*time.Second {
		t.Fatalf("DELETE took %s: it waited for the command", took)
	}
	t.Logf("DELETE during sleep 60 took %s", took.Round(time.Millisecond))
	// The container goes in the background, without holding the answer.
	testenv.WaitNoContainers(t, s.cli, docker.LabelSandbox, id, 20*time.Second)
	select {
	case d := <-done:
		// The answer, if it gets out before the session's stream closes,
		// says the session ended: no "call again".
		err, res := d.err, d.res
		if err == nil {
			msg := text(res)
			if !res.IsError || !strings.HasPrefix(msg, "UNAVAILABLE: the session ended") || strings.Contains(msg, "Call again") {
				t.Errorf("the call in flight was answered %q", msg)
			}
		}
		t.Logf("the call in flight ended with %v %v", err, res)
	case <-time.After(15 * time.Second):
		t.Fatal("the call in flight did not end")
	}
	if r := s.do(http.MethodPost, "", http.Header{"Mcp-Session-Id": {c.cs.ID()}}, `{"jsonrpc":"2.0","id":9,"method":"tools/list"}`); r.status != http.StatusNotFound {
		t.Fatalf("the deleted session answered %d", r.status)
	}
}

// TestHTTPIdleTimeout: a session left idle ends, and so does its sandbox.
func TestHTTPIdleTimeout(t *testing.T) {
	t.Parallel()
	s := startHTTP(t, httpOpts{args: []string{"--idle-timeout", "3s"}})
	c := s.connect("")
	id := c.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})["sandbox"].(string)
	if len(testenv.Containers(t, s.cli, docker.LabelSandbox, id)) != 1 {
		t.Fatal("no container")
	}
	testenv.WaitNoContainers(t, s.cli, docker.LabelSandbox, id, 30*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := s.do(http.MethodPost, "", http.Header{"Mcp-Session-Id": {c.cs.ID()}}, `{"jsonrpc":"2.0","id":9,"method":"tools/list"}`)
		if r.status == http.StatusNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the idle session still answers: %d", r.status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestHTTPMaxSessions: beyond --max-sessions a new session gets a clear 503
// at once (HTTP case 17), and room comes back when one ends.
func TestHTTPMaxSessions(t *testing.T) {
	s := startHTTP(t, httpOpts{args: []string{"--max-sessions", "2"}})
	c1 := s.connect("")
	c2 := s.connect("")
	c1.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})

	r := s.do(http.MethodPost, "", nil, initializeBody)
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || r.header.Get("Mcp-Session-Id") != "" {
		t.Fatalf("a session beyond the cap: %d Retry-After=%q %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	var body struct {
		Error struct{ Message string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.body), &body); err != nil || !strings.Contains(body.Error.Message, "--max-sandboxes") || !strings.Contains(body.Error.Message, "DELETE") {
		t.Fatalf("the 503 body does not say what to do: %v %s", err, r.body)
	}
	start := time.Now()
	if _, err := s.tryConnect(""); err == nil {
		t.Fatal("a third session was admitted")
	} else {
		t.Logf("the go-sdk client refused for the cap: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the refused client waited %s", took)
	}
	// The sessions in place work on.
	c2.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})

	if err := c1.cs.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c3, err := s.tryConnect("")
		if err == nil {
			c3.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no room after a session ended: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestHTTPBodyCap: a largest-file write in base64 fits the body cap, and
// one byte beyond the cap is 413 (HTTP case 15, path case 17).
func TestHTTPBodyCap(t *testing.T) {
	const maxFile = 1 << 20
	s := startHTTP(t, httpOpts{args: []string{"--max-file-bytes", "1MiB"}})
	c := s.connect("")
	data := make([]byte, maxFile)
	rand.Read(data)
	w := c.ok("sandbox_write_file", map[string]any{"path": "big.bin", "content": base64.StdEncoding.EncodeToString(data), "encoding": "base64"})
	if w["size"].(float64) != maxFile {
		t.Fatalf("write: %v", w)
	}

	limit := httpguard.MaxRequestBody(maxFile)
	if !strings.Contains(s.stderr.String(), fmt.Sprintf("max_request_bytes=%d", limit)) {
		t.Fatalf("the server does not log its body cap %d", limit)
	}
	// A body of exactly the cap is read (the tool refuses the content);
	// one byte more is refused by the transport.
	sess := http.Header{"Mcp-Session-Id": {c.cs.ID()}, "MCP-Protocol-Version": {"2025-11-25"}}
	call := func(n int64) string {
		prefix := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"sandbox_write_file","arguments":{"path":"pad.txt","content":"`
		suffix := `"}}}`
		return prefix + strings.Repeat("a", int(n)-len(prefix)-len(suffix)) + suffix
	}
	if r := s.do(http.MethodPost, "", sess, call(limit)); r.status != http.StatusOK || !strings.Contains(r.body, "TOO_LARGE") {
		t.Fatalf("a body of the cap: %d %.300s", r.status, r.body)
	}
	if r := s.do(http.MethodPost, "", sess, call(limit+1)); r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body of the cap + 1: %d %.300s", r.status, r.body)
	}
	if r := s.do(http.MethodPost, "", nil, call(limit+1)); r.status != http.StatusRequestEntityTooLarge || r.header.Get("Mcp-Session-Id") != "" {
		t.Fatalf("a body of the cap + 1 without a session: %d %.300s", r.status, r.body)
	}
	if r := c.ok("sandbox_list", nil); len(r["entries"].([]any)) != 1 {
		t.Fatalf("the workspace changed: %v", r)
	}
}

// TestHTTPSlowClients: a client trickling its header is cut off at the
// header timeout, and one that never finishes its body at the read timeout
// (HTTP cases 15, 16).
func TestHTTPSlowClients(t *testing.T) {
	t.Parallel()
	s := startHTTP(t, httpOpts{})
	hostport := strings.TrimPrefix(s.base, "http://")

	// closedWithin sends head, then trickles a byte a second, until the
	// server closes the connection; it returns how long that took.
	closedWithin := func(t *testing.T, head string, limit time.Duration) time.Duration {
		conn, err := net.Dial("tcp", hostport)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		start := time.Now()
		if _, err := io.WriteString(conn, head); err != nil {
			t.Fatal(err)
		}
		closed := make(chan struct{})
		go func() {
			io.Copy(io.Discard, conn) // ends when the server closes
			close(closed)
		}()
		for {
			select {
			case <-closed:
				return time.Since(start)
			case <-time.After(time.Second):
			}
			if time.Since(start) > limit {
				t.Fatalf("the connection is still open after %s", limit)
			}
			conn.Write([]byte("a"))
		}
	}
	t.Run("slow header", func(t *testing.T) {
		t.Parallel()
		took := closedWithin(t, "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ", httpReadHeaderTimeout+5*time.Second)
		if took < httpReadHeaderTimeout-time.Second {
			t.Fatalf("closed after %s, before the header timeout", took)
		}
		t.Logf("a trickled header was cut after %s", took.Round(time.Millisecond))
	})
	t.Run("endless chunked body", func(t *testing.T) {
		t.Parallel()
		head := "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n1000\r\n"
		took := closedWithin(t, head, httpReadTimeout+10*time.Second)
		t.Logf("an endless body was cut after %s", took.Round(time.Millisecond))
	})
}

// TestHTTPShutdown: SIGTERM during a long command ends the server within
// the bound, with no sandbox left.
func TestHTTPShutdown(t *testing.T) {
	s := startHTTP(t, httpOpts{})
	c := s.connect("")
	id := c.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})["sandbox"].(string)
	c.running(context.Background(), "echo started; exec sleep 300")
	start := time.Now()
	if !s.stop(30 * time.Second) {
		t.Fatal("the server did not exit within 30s of SIGTERM")
	}
	t.Logf("exited %s after SIGTERM", time.Since(start).Round(time.Millisecond))
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit status %d after SIGTERM", code)
	}
	if left := testenv.Containers(t, s.cli, docker.LabelSandbox, id); len(left) != 0 {
		t.Fatalf("container left after SIGTERM: %v", left)
	}
	if _, err := net.DialTimeout("tcp", strings.TrimPrefix(s.base, "http://"), time.Second); err == nil {
		t.Fatal("the port still accepts connections")
	}
}

// TestHTTPLoad: 32 sessions, each with its own sandbox, run commands at
// once with no error; afterwards no container is left.
func TestHTTPLoad(t *testing.T) {
	const sessions, execs = 32, 50
	s := startHTTP(t, httpOpts{args: []string{"--memory", "64MiB", "--max-workspace-bytes", "16MiB", "--max-sessions", "32"}})
	var (
		mu        sync.Mutex
		latencies []time.Duration
		firsts    []time.Duration
		errs      []error
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Go(func() {
			t0 := time.Now()
			c, err := s.tryConnect("")
			if err != nil {
				fail(fmt.Errorf("session %d: connect: %w", i, err))
				return
			}
			for j := range execs {
				t1 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				res, err := c.cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"argv": []string{"sh", "-c", fmt.Sprintf("echo %d-%d", i, j)}}})
				cancel()
				d := time.Since(t1)
				if err != nil || res.IsError {
					fail(fmt.Errorf("session %d exec %d: %v %v", i, j, err, res))
					continue
				}
				out := res.StructuredContent.(map[string]any)
				c.mu.Lock()
				c.sandboxes[out["sandbox"].(string)] = true
				c.mu.Unlock()
				if out["stdout"] != fmt.Sprintf("%d-%d\n", i, j) {
					fail(fmt.Errorf("session %d exec %d: stdout %q", i, j, out["stdout"]))
				}
				mu.Lock()
				if j == 0 {
					firsts = append(firsts, time.Since(t0))
				} else {
					latencies = append(latencies, d)
				}
				mu.Unlock()
			}
			if err := c.cs.Close(); err != nil {
				fail(fmt.Errorf("session %d: close: %w", i, err))
			}
		})
	}
	wg.Wait()
	total := time.Since(start)
	if len(errs) > 0 {
		t.Fatalf("%d errors, first: %v", len(errs), errs[0])
	}
	slices.Sort(latencies)
	slices.Sort(firsts)
	pct := func(d []time.Duration, p float64) time.Duration {
		return d[int(p*float64(len(d)-1))].Round(100 * time.Microsecond)
	}
	t.Logf("%d sessions × %d execs in %s, 0 errors; first exec (connect → result) p50 %s p99 %s; warm exec p50 %s p99 %s",
		sessions, execs, total.Round(time.Millisecond), pct(firsts, 0.5), pct(firsts, 0.99), pct(latencies, 0.5), pct(latencies, 0.99))
	// Every session ended with DELETE: every container is gone.
	s.mu.Lock()
	clients := slices.Clone(s.clients)
	s.mu.Unlock()
	for _, c := range clients {
		for id := range c.sandboxes {
			testenv.WaitNoContainers(t, s.cli, docker.LabelSandbox, id, 20*time.Second)
		}
	}
}
