package httpguard

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestPreviewsBehindTheGuard: on the --http listener, /preview/ is served
// without a token but behind the Host and Origin checks, while a client
// of /mcp with no Origin, or an --allow-origin one, still reaches the
// token check.
// PreviewHandler applies the same Host and Origin checks on a listener of
// its own.
func TestPreviewsBehindTheGuard(t *testing.T) {
	previews := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "preview") })
	listen, _ := net.ResolveTCPAddr("tcp", "127.0.0.1:8080")
	o := Options{Addr: "127.0.0.1:8080", Listen: listen, Tokens: []string{"a-token-of-16-chars-or-more"},
		AllowOrigins: []string{"https://tools.example"}, MaxSessions: 1, SessionsPerCaller: 1, CallsPerCaller: 1, Preview: previews}
	g, err := New(o, mcp.NewServer(&mcp.Implementation{Name: "t", Version: "0"}, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	h := g.Handler()
	own, err := PreviewHandler(o, previews)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		h          http.Handler
		path, host string
		origin     string
		want       int
	}{
		{h, "/preview/tok/", "127.0.0.1:8080", "", 200},
		{h, "/preview/tok/", "127.0.0.1:8080", "http://127.0.0.1:8080", 200},
		{h, "/preview/tok/", "evil.example", "", 403},
		{h, "/preview/tok/", "127.0.0.1:8080", "https://evil.example", 403},
		{h, "/mcp", "127.0.0.1:8080", "", 401},
		{h, "/mcp", "127.0.0.1:8080", "https://tools.example", 401},
		{own, "/preview/tok/", "localhost:8080", "", 200},
		{own, "/preview/tok/", "attacker.example", "", 403},
		{own, "/preview/tok/", "localhost:8080", "null", 403},
	} {
		r := httptest.NewRequest("GET", "http://"+tc.host+tc.path, nil)
		r.Host = tc.host
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		w := httptest.NewRecorder()
		tc.h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("%s Host %s Origin %q: %d, want %d (%s)", tc.path, tc.host, tc.origin, w.Code, tc.want, w.Body)
		}
	}
}
