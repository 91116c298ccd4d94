package netproxy

import (
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// pctAll percent-encodes every byte of s, with upper or lower hex.
func pctAll(s string, upper bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if upper {
			fmt.Fprintf(&b, "%%%02X", s[i])
		} else {
			fmt.Fprintf(&b, "%%%02x", s[i])
		}
	}
	return b.String()
}

// reflector is a hostile upstream: it puts the credential it receives (the
// real value) into whatever part of its response the path asks for.
type reflector struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (rf *reflector) seen() []*http.Request {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	return append([]*http.Request(nil), rf.reqs...)
}

func (rf *reflector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rf.mu.Lock()
	rf.reqs = append(rf.reqs, r)
	rf.mu.Unlock()
	v := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	h := w.Header()
	switch path := r.URL.Path; {
	case path == "/hints":
		h.Set("Link", "</s.css?t="+v+">; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		h.Del("Link")
		io.WriteString(w, "ok")
	case path == "/header":
		h.Set("X-Echo", v)
		h.Set("X-Echo-Pct", pctAll(v, false))
		h.Set("X-Echo-Basic", "Basic "+base64.StdEncoding.EncodeToString([]byte("x:"+v)))
		io.WriteString(w, "ok")
	case path == "/trailer":
		h.Set("Trailer", "X-Trailer-Echo")
		io.WriteString(w, "ok")
		h.Set("X-Trailer-Echo", "token="+v)
	case path == "/redirect/literal":
		h.Set("Location", "https://example.com/next?t="+v)
		w.WriteHeader(http.StatusFound)
		fmt.Fprintf(w, `<a href="https://example.com/next?t=%s">moved</a>`, v)
	case path == "/redirect/pct-upper", path == "/redirect/pct-lower":
		h.Set("Location", "/next?t="+pctAll(v, strings.HasSuffix(path, "upper")))
		w.WriteHeader(http.StatusFound)
	case path == "/redirect/base64":
		h.Set("Location", "/next?state="+base64.URLEncoding.EncodeToString([]byte(v)))
		w.WriteHeader(http.StatusFound)
	case path == "/body/404":
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, "<h1>Not found</h1><p>No page at %s for the token %s</p>", r.URL.Path, v)
	case path == "/body/json":
		json.NewEncoder(w).Encode(map[string]any{"headers": map[string]string{"Authorization": r.Header.Get("Authorization")}, "path": "/a/" + v})
	case path == "/body/base64":
		io.WriteString(w, base64.StdEncoding.EncodeToString([]byte("x:"+v)))
	case path == "/body/split":
		// The value split between two chunks at the offset asked for.
		body := "<p>" + v + "</p>"
		cut, _ := strconv.Atoi(r.URL.Query().Get("at"))
		io.WriteString(w, body[:cut])
		w.(http.Flusher).Flush()
		io.WriteString(w, body[cut:])
	case path == "/gzip": // compressed although asked not to
		h.Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		fmt.Fprintf(zw, "compressed %s", v)
		zw.Close()
	case path == "/gzip-big": // 64 KiB and more once decoded, though small on the wire
		h.Set("Content-Encoding", "gzip")
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		zw.Write(bytes.Repeat([]byte("a"), 100<<10))
		fmt.Fprintf(zw, "[%s]", v)
		zw.Close()
		h.Set("Content-Length", strconv.Itoa(b.Len()))
		w.Write(b.Bytes())
	case path == "/body/big": // past the size read whole, with a Content-Length
		body := strings.Repeat("a", 70<<10) + v
		h.Set("Content-Length", strconv.Itoa(len(body)))
		io.WriteString(w, body)
	case path == "/br":
		h.Set("Content-Encoding", "br")
		io.WriteString(w, "\x1b\x03"+v)
	default:
		io.WriteString(w, "ok")
	}
}

// reflectorHarness serves a reflector over TLS for example.com and a
// client that reaches it through the proxy with the sandbox's placeholder
// as its bearer token. The client follows no redirect and leaves bodies
// as they come.
func reflectorHarness(t *testing.T) (rf *reflector, do func(method, path string, hdr ...string) (*http.Response, []byte, http.Header), ph string) {
	rf = &reflector{}
	srv := httptest.NewUnstartedServer(rf)
	srv.EnableHTTP2 = false
	srv.StartTLS()
	t.Cleanup(srv.Close)
	h, client, _ := secretHarness(t, srv, upstreamRoots(srv), "example.com")
	client.Transport.(*http.Transport).DisableCompression = true
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	ph = strings.TrimPrefix(h.p.SecretEnv("sandbox-1")[0], "TOKEN=")
	base := fmt.Sprintf("https://example.com:%d", srv.Listener.Addr().(*net.TCPAddr).Port)
	do = func(method, path string, hdr ...string) (*http.Response, []byte, http.Header) {
		t.Helper()
		var early http.Header
		trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			early = http.Header(h).Clone()
			return nil
		}}
		req, _ := http.NewRequest(method, base+path, nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
		req.Header.Set("Authorization", "Bearer "+ph)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s %s: body: %v", method, path, err)
		}
		return resp, body, early
	}
	return rf, do, ph
}

// everything is all the sandbox received of a response, as text.
func everything(resp *http.Response, body []byte, early http.Header) string {
	var b bytes.Buffer
	early.Write(&b)
	resp.Header.Write(&b)
	resp.Trailer.Write(&b)
	b.Write(body)
	return b.String()
}

// checkNoValue fails if text holds the value in any encoding the test
// knows (made with the standard library, not the proxy's own matcher).
func checkNoValue(t *testing.T, what, text string) {
	t.Helper()
	for name, enc := range textEncodings(testSecret) {
		if strings.Contains(text, enc) {
			t.Errorf("%s: the sandbox received the value (%s): %q", what, name, text)
		}
	}
	for name, enc := range base64Encodings(testSecret) {
		if strings.Contains(text, enc) {
			t.Errorf("%s: the sandbox received the value (%s): %q", what, name, text)
		}
	}
}

// Proxy case 63: a hostile upstream on a secret's host reflects the real
// value into every part of its answers: an informational 103 response's
// header, the final header (literal, percent-encoded, inside Basic), a
// trailer, a redirect's Location (literal, percent-encoded in upper and
// lower hex, base64) and body, a 404 page, JSON, base64. The sandbox gets
// the placeholder back everywhere; the value never.
func TestInterceptScrubsResponses(t *testing.T) {
	_, do, ph := reflectorHarness(t)
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, c := range []struct {
		path  string
		check func(resp *http.Response, body []byte, early http.Header) string
	}{
		{"/hints", func(resp *http.Response, body []byte, early http.Header) string {
			return early.Get("Link") + "|" + string(body)
		}},
		{"/header", func(resp *http.Response, _ []byte, _ http.Header) string {
			return resp.Header.Get("X-Echo") + "|" + resp.Header.Get("X-Echo-Pct") + "|" + resp.Header.Get("X-Echo-Basic")
		}},
		{"/trailer", func(resp *http.Response, body []byte, _ http.Header) string {
			return resp.Trailer.Get("X-Trailer-Echo") + "|" + string(body)
		}},
		{"/redirect/literal", func(resp *http.Response, body []byte, _ http.Header) string {
			return resp.Header.Get("Location") + "|" + string(body)
		}},
		{"/redirect/pct-upper", func(resp *http.Response, _ []byte, _ http.Header) string { return resp.Header.Get("Location") }},
		{"/redirect/pct-lower", func(resp *http.Response, _ []byte, _ http.Header) string { return resp.Header.Get("Location") }},
		{"/redirect/base64", func(resp *http.Response, _ []byte, _ http.Header) string { return resp.Header.Get("Location") }},
		{"/body/404", func(_ *http.Response, body []byte, _ http.Header) string { return string(body) }},
		{"/body/json", func(_ *http.Response, body []byte, _ http.Header) string { return string(body) }},
		{"/body/base64", func(_ *http.Response, body []byte, _ http.Header) string { return string(body) }},
		{"/gzip", func(resp *http.Response, body []byte, _ http.Header) string {
			return resp.Header.Get("Content-Encoding") + "|" + string(body)
		}},
		{"/gzip-big", func(resp *http.Response, body []byte, _ http.Header) string {
			return resp.Header.Get("Content-Encoding") + "|" + strings.TrimLeft(string(body), "a") + "|" + strconv.FormatInt(resp.ContentLength, 10)
		}},
		{"/body/big", func(resp *http.Response, body []byte, _ http.Header) string {
			return strings.TrimLeft(string(body), "a") + "|" + strconv.FormatInt(resp.ContentLength, 10)
		}},
	} {
		resp, body, early := do("GET", c.path)
		checkNoValue(t, c.path, everything(resp, body, early))
		want := map[string]string{
			"/hints":              "</s.css?t=" + ph + ">; rel=preload|ok",
			"/header":             ph + "|" + ph + "|Basic " + b64("x:"+ph),
			"/trailer":            "token=" + ph + "|ok",
			"/redirect/literal":   "https://example.com/next?t=" + ph + `|<a href="https://example.com/next?t=` + ph + `">moved</a>`,
			"/redirect/pct-upper": "/next?t=" + ph,
			"/redirect/pct-lower": "/next?t=" + ph,
			"/redirect/base64":    "/next?state=" + base64.URLEncoding.EncodeToString([]byte(ph)),
			"/body/404":           "<h1>Not found</h1><p>No page at /body/404 for the token " + ph + "</p>",
			"/body/json":          `{"headers":{"Authorization":"Bearer ` + ph + `"},"path":"/a/` + ph + `"}` + "\n",
			"/gzip":               "|compressed " + ph,
			"/gzip-big":           "|[" + ph + "]|-1",
			"/body/big":           ph + "|-1",
		}[c.path]
		// A small body keeps a Content-Length, its scrubbed length.
		if resp.ContentLength != -1 && resp.ContentLength != int64(len(body)) || c.path == "/body/404" && resp.ContentLength == -1 {
			t.Errorf("%s: Content-Length %d for %d bytes", c.path, resp.ContentLength, len(body))
		}
		got := c.check(resp, body, early)
		if c.path == "/body/base64" {
			if !strings.Contains(got, ph) {
				t.Errorf("%s: %q, want the placeholder in place of the value", c.path, got)
			}
			continue
		}
		if got != want {
			t.Errorf("%s: the sandbox got %q, want %q", c.path, got, want)
		}
	}
}

// Proxy case 64: a body that reflects the value is scrubbed as it streams,
// wherever the host's chunks cut it: at every offset across the value.
func TestInterceptScrubsSplitBodies(t *testing.T) {
	_, do, ph := reflectorHarness(t)
	body := "<p>" + testSecret + "</p>"
	for at := 0; at <= len(body); at++ {
		resp, got, early := do("GET", fmt.Sprintf("/body/split?at=%d", at))
		checkNoValue(t, fmt.Sprintf("cut at %d", at), everything(resp, got, early))
		if string(got) != "<p>"+ph+"</p>" {
			t.Errorf("cut at %d: %q", at, got)
		}
		if resp.ContentLength != -1 && resp.ContentLength != int64(len(got)) {
			t.Errorf("cut at %d: Content-Length %d for %d bytes", at, resp.ContentLength, len(got))
		}
	}
}

// Proxy case 65: the placeholder in a request's path and query goes out
// unchanged (an upstream that echoes URLs gets nothing to echo); the
// request asks for an uncompressed, whole response; a body in a coding the
// proxy cannot decode is refused rather than passed on; a protocol switch
// is refused before it reaches the host.
func TestInterceptRequestShape(t *testing.T) {
	rf, do, ph := reflectorHarness(t)
	do("GET", "/p/"+ph+"?q="+ph, "Range", "bytes=0-3", "If-Range", `"x"`, "Accept-Encoding", "gzip, br")
	seen := rf.seen()
	if len(seen) != 1 {
		t.Fatalf("the host saw %d requests", len(seen))
	}
	r := seen[0]
	if r.RequestURI != "/p/"+ph+"?q="+ph {
		t.Errorf("the host saw the target %q, want the placeholder unchanged", r.RequestURI)
	}
	if r.Header.Get("Authorization") != "Bearer "+testSecret {
		t.Errorf("the host did not get the value in Authorization")
	}
	if r.Header.Get("Range") != "" || r.Header.Get("If-Range") != "" || r.Header.Get("Accept-Encoding") != "identity" {
		t.Errorf("the host saw Range %q, If-Range %q, Accept-Encoding %q; want no range and identity",
			r.Header.Get("Range"), r.Header.Get("If-Range"), r.Header.Get("Accept-Encoding"))
	}

	resp, body, _ := do("GET", "/br")
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), `content coding "br"`) || strings.Contains(string(body), testSecret) {
		t.Errorf("br body: %d %q, want a 502 that says why", resp.StatusCode, body)
	}

	n := len(rf.seen())
	resp, body, _ = do("GET", "/ws", "Connection", "Upgrade", "Upgrade", "websocket")
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "does not switch protocols") {
		t.Errorf("upgrade: %d %q, want 403", resp.StatusCode, body)
	}
	if len(rf.seen()) != n {
		t.Errorf("the upgrade request reached the host")
	}
}

// TestInterceptURLOption: a secret with InURL goes into the path and query
// too (and what comes back is scrubbed the same way).
func TestInterceptURLOption(t *testing.T) {
	rf := &reflector{}
	srv := httptest.NewTLSServer(rf)
	t.Cleanup(srv.Close)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	h := newHarness(t, Config{
		AllowPrivate: true,
		Allow:        mustAllowlist(t, fmt.Sprintf("example.com:%d", port)),
		Secrets:      []Secret{{Name: "KEY", Value: testSecret, Hosts: []string{"example.com"}, InURL: true, Headers: []string{"X-Api-Key"}}},
		RootCAs:      upstreamRoots(srv),
	}, realDialer)
	h.res.setAddrs("example.com", "127.0.0.1")
	ph := strings.TrimPrefix(h.p.SecretEnv("sandbox-1")[0], "KEY=")
	resp, _, c := h.connect(fmt.Sprintf("example.com:%d", port))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.p.CACert())
	tc := tls.Client(c, &tls.Config{ServerName: "example.com", RootCAs: pool})
	fmt.Fprintf(tc, "GET /redirect/literal?key=%s HTTP/1.1\r\nHost: example.com\r\nX-Api-Key: %s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", ph, ph, ph)
	out, _ := io.ReadAll(tc)
	seen := rf.seen()
	if len(seen) != 1 || seen[0].RequestURI != "/redirect/literal?key="+testSecret || seen[0].Header.Get("X-Api-Key") != testSecret {
		t.Fatalf("the host saw %+v", seen)
	}
	checkNoValue(t, "with InURL", string(out))
	if !strings.Contains(string(out), "Location: https://example.com/next?t="+ph) {
		t.Errorf("the sandbox got %q", out)
	}
}
