package main

import (
	"bufio"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

// wsServer is a node server with a WebSocket written by hand (no npm):
// the handshake with crypto's SHA-1, then each masked text frame of up to
// 125 bytes echoed back with "echo: " before it.
const wsServer = `const http = require('http'), crypto = require('crypto');
const s = http.createServer((q, r) => r.end('node ok'));
s.on('upgrade', (req, sock) => {
  const acc = crypto.createHash('sha1').update(req.headers['sec-websocket-key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
  sock.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + acc + '\r\n\r\n');
  sock.on('data', b => {
    const n = b[1] & 0x7f, mask = b.subarray(2, 6), data = Buffer.alloc(n);
    for (let i = 0; i < n; i++) data[i] = b[6 + i] ^ mask[i % 4];
    const msg = Buffer.from('echo: ' + data.toString());
    sock.write(Buffer.concat([Buffer.from([0x81, msg.length]), msg]));
  });
});
s.listen(8002, '127.0.0.1', () => console.log('listening'));
`

// prepareDefault prepares the default image for a server with args, as
// `make run` does, so the first call does not wait for it.
func prepareDefault(t *testing.T, args []string) {
	t.Helper()
	prep := exec.Command(bins.Get(t).Server, append([]string{"prepare"}, args...)...)
	prep.Env = serverEnv(t)
	if out, err := prep.CombinedOutput(); err != nil {
		t.Fatalf("sandbox-mcp prepare: %v\n%s", err, out)
	}
}

func httpGet(t *testing.T, u string, hdr http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if h := hdr.Get("Host"); h != "" {
		req.Host = h
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// serveDirs starts python's http.server on 8000 (the workspace) and on
// 8001 (a directory with a file that must never be seen through a preview
// of 8000) in the background.
func serveDirs(s *server) {
	s.t.Helper()
	s.ok("sandbox_write_file", map[string]any{"path": "hello-preview.txt", "content": "hi"})
	s.ok("sandbox_write_file", map[string]any{"path": "other/secret-8001.txt", "content": "no"})
	s.ok("sandbox_exec", map[string]any{"command": "python3 -m http.server 8000 --bind 127.0.0.1", "background": true})
	s.ok("sandbox_exec", map[string]any{"command": "cd other && python3 -m http.server 8001 --bind 127.0.0.1", "background": true})
}

// exposeListening exposes port and waits for it, failing unless something
// listens; it returns the URL.
func exposeListening(s *server, args map[string]any) string {
	s.t.Helper()
	out := s.ok("sandbox_expose", args)
	if out["listening"] != true {
		s.t.Fatalf("sandbox_expose %v: not listening: %v", args, out)
	}
	u, _ := out["url"].(string)
	if !strings.Contains(u, "/preview/") || out["expires_at"] == "" {
		s.t.Fatalf("sandbox_expose: %v", out)
	}
	return u
}

// TestHTTPPreview: a sandbox with no network runs python's http.server on
// 8000; sandbox_expose waits for it and gives a URL that the HTTP
// listener serves: a GET returns the directory listing. A second server
// on 8001 is not reachable through the URL space; a wrong token, a
// revoked preview and an expired one get the same 404. Another caller can
// neither expose nor revoke a preview of a sandbox it does not own, and
// its own preview reaches only its own sandbox. A node server's WebSocket
// (handshake by hand) echoes through the preview URL, with the Origin a
// browser sends.
func TestHTTPPreview(t *testing.T) {
	const ttl = 60 * time.Second
	img := testenv.DefaultImage(t)
	args := []string{"--image", img, "--network", "none", "--preview-ttl", ttl.String()}
	prepareDefault(t, append(serverArgs(t), args...))
	h := startHTTP(t, httpOpts{args: args, env: []string{"SANDBOX_MCP_TOKEN=" + tokenA + "," + tokenB}})
	a, err := h.tryConnectAt(tokenA, "2025-11-25")
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.tryConnectAt(tokenB, "2025-11-25")
	if err != nil {
		t.Fatal(err)
	}
	serveDirs(a)
	res := a.call("sandbox_expose", map[string]any{"port": 8000, "wait_ms": 20000})
	if res.IsError || !strings.Contains(text(res), "/preview/") {
		t.Fatalf("expose: %s", text(res))
	}
	out := res.StructuredContent.(map[string]any)
	u, idA := out["url"].(string), out["sandbox"].(string)
	if out["listening"] != true || !strings.HasPrefix(u, h.base+"/preview/") {
		t.Fatalf("expose: %v", out)
	}
	code, body := httpGet(t, u, nil)
	if code != 200 || !strings.Contains(body, "Directory listing") || !strings.Contains(body, "hello-preview.txt") {
		t.Fatalf("GET %s: %d %s", u, code, body)
	}
	if code, body := httpGet(t, u+"hello-preview.txt", nil); code != 200 || body != "hi" {
		t.Fatalf("a file through the preview: %d %q", code, body)
	}

	// Only 8000: no Host, path or escape reaches 8001.
	parsed, _ := url.Parse(u)
	token := strings.Split(strings.TrimPrefix(parsed.Path, "/preview/"), "/")[0]
	for _, try := range []struct {
		path string
		hdr  http.Header
	}{
		{"/preview/" + token + "/", http.Header{"Host": {"localhost:8001"}}},
		{"/preview/" + token + "/%2e%2e/8001/", nil},
		{"/preview/" + token + "//127.0.0.1:8001/", nil},
		{"/preview/" + token + ":8001/", nil},
		{"/preview/8001/", nil},
		{"/preview/" + token + "/", http.Header{"X-Forwarded-Host": {"localhost:8001"}, "Forwarded": {"host=localhost:8001"}}},
	} {
		_, body := httpGet(t, h.base+try.path, try.hdr)
		if strings.Contains(body, "secret-8001") {
			t.Fatalf("%s %v reached the server on 8001: %s", try.path, try.hdr, body)
		}
	}
	// A wrong token: 404.
	wrongCode, wrong := httpGet(t, h.base+"/preview/"+strings.Repeat("x", len(token))+"/", nil)
	if wrongCode != 404 {
		t.Fatalf("a wrong token: %d %s", wrongCode, wrong)
	}

	// Another caller: neither expose nor revoke in A's sandbox.
	b.fails("sandbox_expose", map[string]any{"port": 8000, "sandbox": idA}, "NOT_FOUND")
	b.fails("sandbox_expose", map[string]any{"port": 8000, "sandbox": idA, "revoke": true}, "NOT_FOUND")
	own := b.ok("sandbox_expose", map[string]any{"port": 8000})
	if own["sandbox"] == idA || own["listening"] != false || own["url"] == u {
		t.Fatalf("B's own preview: %v", own)
	}
	if code, body := httpGet(t, own["url"].(string), nil); code == 200 || strings.Contains(body, "hello-preview") {
		t.Fatalf("B's preview of its own sandbox reached A's server: %d %s", code, body)
	}
	if code, _ := httpGet(t, u, nil); code != 200 {
		t.Fatalf("A's preview stopped working after B's calls: %d", code)
	}

	// A WebSocket through the preview.
	a.ok("sandbox_write_file", map[string]any{"path": "ws.js", "content": wsServer})
	a.ok("sandbox_exec", map[string]any{"command": "node ws.js", "background": true})
	wsURL := exposeListening(a, map[string]any{"port": 8002, "wait_ms": 20000})
	if code, body := httpGet(t, wsURL, nil); code != 200 || body != "node ok" {
		t.Fatalf("node through the preview: %d %q", code, body)
	}
	if got := wsEcho(t, wsURL, h.base, "hello through the agent"); got != "echo: hello through the agent" {
		t.Fatalf("the WebSocket answered %q", got)
	}
	// Revoked: the same 404 as a wrong token.
	if n := a.ok("sandbox_expose", map[string]any{"port": 8002, "revoke": true})["revoked"]; n != float64(1) {
		t.Fatalf("revoked %v", n)
	}
	if code, body := httpGet(t, wsURL, nil); code != 404 || body != wrong {
		t.Fatalf("revoked: %d %q, want %q", code, body, wrong)
	}

	// Expired: the same 404. expires_at is in whole seconds.
	expires, err := time.Parse(time.RFC3339, out["expires_at"].(string))
	if err != nil || expires.Sub(time.Now()) > ttl {
		t.Fatalf("expires_at %v: %v", out["expires_at"], err)
	}
	time.Sleep(time.Until(expires.Add(2 * time.Second)))
	if code, body := httpGet(t, u, nil); code != 404 || body != wrong {
		t.Fatalf("expired: %d %q, want %q", code, body, wrong)
	}
}

// wsEcho opens a WebSocket at u (http://...) with the Origin a browser
// on origin sends, sends msg in one masked text frame and returns the
// text of the frame that comes back.
func wsEcho(t *testing.T, u, origin, msg string) string {
	t.Helper()
	p, _ := url.Parse(u)
	c, err := net.DialTimeout("tcp", p.Host, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	kb := make([]byte, 16)
	rand.Read(kb)
	key := base64.StdEncoding.EncodeToString(kb)
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nOrigin: %s\r\n\r\n",
		p.RequestURI(), p.Host, key, origin)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	if resp.StatusCode != 101 || resp.Header.Get("Sec-WebSocket-Accept") != base64.StdEncoding.EncodeToString(sum[:]) {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("upgrade: %s %v %s", resp.Status, resp.Header, body)
	}
	mask := []byte{1, 2, 3, 4}
	frame := []byte{0x81, 0x80 | byte(len(msg))}
	frame = append(frame, mask...)
	for i := range len(msg) {
		frame = append(frame, msg[i]^mask[i%4])
	}
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 2)
	if _, err := io.ReadFull(br, head); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, head[1]&0x7f)
	if _, err := io.ReadFull(br, data); err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestStdioPreview: over stdio, previews are off unless --preview-listen
// is set (the tool says so); with it, the URL on that listener reaches
// python's http.server in a sandbox with no network, and only its port.
func TestStdioPreview(t *testing.T) {
	img := testenv.DefaultImage(t)
	off := startServer(t, serverOpts{image: testenv.TestImage(t), protocol: "2025-11-25"})
	if msg := off.fails("sandbox_expose", map[string]any{"port": 8000}, "POLICY_DENIED"); !strings.Contains(msg, "--preview-listen") {
		t.Fatalf("the refusal does not name --preview-listen: %s", msg)
	}
	s := startServer(t, serverOpts{image: img, protocol: "2025-11-25", args: []string{"--network", "none", "--preview-listen", "127.0.0.1:0"}})
	serveDirs(s)
	u := exposeListening(s, map[string]any{"port": 8000, "wait_ms": 20000, "path": "hello-preview.txt"})
	if code, body := httpGet(t, u, nil); code != 200 || body != "hi" {
		t.Fatalf("GET %s: %d %q", u, code, body)
	}
	root := u[:strings.LastIndex(u, "/")+1]
	if code, body := httpGet(t, root, nil); code != 200 || !strings.Contains(body, "hello-preview.txt") || strings.Contains(body, "secret-8001") {
		t.Fatalf("GET %s: %d %s", root, code, body)
	}
	p, _ := url.Parse(u)
	if code, _ := httpGet(t, p.Scheme+"://"+p.Host+"/mcp", nil); code != 404 {
		t.Fatalf("the preview listener serves /mcp: %d", code)
	}
	if code, _ := httpGet(t, root, http.Header{"Host": {"evil.example"}}); code != 403 {
		t.Fatalf("a foreign Host got %d, want 403", code)
	}
}
