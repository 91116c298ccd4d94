package preview

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// backends starts one HTTP server per "sandbox port" on the host's
// loopback and returns a dial function that maps a sandbox port to it,
// as the agent's stream does inside a sandbox.
func backends(t *testing.T, ports ...int) DialFunc {
	t.Helper()
	addrs := map[int]string{}
	for _, p := range ports {
		mux := http.NewServeMux()
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "port %d path %s host %s", p, r.URL.Path, r.Host)
		})
		mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
			// Not a WebSocket framing: an upgrade, then an echo.
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
			brw.Flush()
			io.Copy(c, brw)
		})
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		addrs[p] = srv.Listener.Addr().String()
	}
	return func(ctx context.Context, port int) (net.Conn, error) {
		a, ok := addrs[port]
		if !ok {
			return nil, fmt.Errorf("nothing listens on port %d", port)
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", a)
	}
}

func get(t *testing.T, url string, host string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPreviewReachesOnlyItsPort: the URL reaches the exposed port with the
// path under the token; no Host header, absolute path or escape reaches
// another port; a wrong token, a revoked preview, an expired one and one
// whose sandbox ended all get the same 404.
func TestPreviewReachesOnlyItsPort(t *testing.T) {
	dial := backends(t, 8000, 8001)
	reg := New(Options{TTL: time.Hour})
	srv := httptest.NewServer(reg)
	defer srv.Close()
	reg.opts.BaseURL = srv.URL
	done := make(chan struct{})
	info, err := reg.Expose(Target{Owner: "a", Sandbox: "sbx-1", Port: 8000, Path: "docs/", Dial: dial, Done: done})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(info.URL, srv.URL+"/preview/") || !strings.HasSuffix(info.URL, "/docs/") || len(info.Token) < 43 {
		t.Fatalf("url %q token %q", info.URL, info.Token)
	}
	if code, body := get(t, info.URL, ""); code != 200 || body != "port 8000 path /docs/ host localhost:8000" {
		t.Fatalf("%d %q", code, body)
	}
	base := srv.URL + Prefix + info.Token
	for _, u := range []string{base + "/x", base + "/..%2f8001/", base + "//localhost:8001/"} {
		if code, body := get(t, u, "localhost:8001"); strings.Contains(body, "8001 path") || code == 200 && !strings.HasPrefix(body, "port 8000") {
			t.Fatalf("%s reached %d %q", u, code, body)
		}
	}
	code, body := get(t, base, "")
	if code != 200 || !strings.HasPrefix(body, "port 8000 path /") {
		t.Fatalf("the token without a slash: %d %q", code, body)
	}
	wrongCode, wrong := get(t, srv.URL+Prefix+strings.Repeat("A", 43)+"/", "")
	if wrongCode != 404 {
		t.Fatalf("a wrong token: %d", wrongCode)
	}
	// Exposed again: the same URL, renewed.
	again, err := reg.Expose(Target{Owner: "a", Sandbox: "sbx-1", Port: 8000, Dial: dial, Done: done})
	if err != nil || again.Token != info.Token {
		t.Fatalf("exposing again gave %v %v", again, err)
	}
	if n := reg.Revoke("b", "sbx-1", 8000); n != 0 {
		t.Fatal("another owner revoked the preview")
	}
	if n := reg.Revoke("a", "sbx-1", 8000); n != 1 {
		t.Fatalf("revoked %d", n)
	}
	if code, body := get(t, info.URL, ""); code != 404 || body != wrong {
		t.Fatalf("revoked: %d %q, want %q", code, body, wrong)
	}
	// The sandbox's end.
	info2, _ := reg.Expose(Target{Owner: "a", Sandbox: "sbx-1", Port: 8000, Dial: dial, Done: done})
	close(done)
	time.Sleep(50 * time.Millisecond)
	if code, body := get(t, info2.URL, ""); code != 404 || body != wrong {
		t.Fatalf("after the sandbox ended: %d %q", code, body)
	}
	// Expiry.
	short := New(Options{TTL: 200 * time.Millisecond, BaseURL: srv.URL})
	srv.Config.Handler = short
	info3, _ := short.Expose(Target{Owner: "a", Sandbox: "sbx-2", Port: 8000, Dial: dial})
	if code, _ := get(t, info3.URL, ""); code != 200 {
		t.Fatalf("before expiry: %d", code)
	}
	time.Sleep(300 * time.Millisecond)
	if code, body := get(t, info3.URL, ""); code != 404 || body != wrong {
		t.Fatalf("expired: %d %q", code, body)
	}
}

// TestPreviewUpgradeAndEnd: an upgraded connection is relayed both ways
// and closed when the preview is revoked.
func TestPreviewUpgradeAndEnd(t *testing.T) {
	dial := backends(t, 8000)
	reg := New(Options{})
	srv := httptest.NewServer(reg)
	defer srv.Close()
	info, _ := reg.Expose(Target{Sandbox: "s", Port: 8000, Dial: dial})
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET %sws HTTP/1.1\r\nHost: %s\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n", Prefix+info.Token+"/", srv.Listener.Addr())
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("%v %v", resp, err)
	}
	io.WriteString(c, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("%q %v", buf, err)
	}
	reg.Revoke("", "s", 0)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the upgraded connection stayed open after the revoke")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the upgraded connection stayed open after the revoke")
	}
}
