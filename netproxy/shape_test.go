package netproxy

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestShape: a sandbox with a Shape (an operator's template) gets its own
// allowlist in place of the server's, and only the secrets it names: the
// others' placeholders are not in its environment, and a tunnel to a host
// only they are for is not intercepted. SetShape refuses a secret the
// proxy does not hold, or one whose host the shape's allowlist lacks.
func TestShape(t *testing.T) {
	srv, _ := secretUpstream(t)
	h, _, _ := secretHarness(t, srv, upstreamRoots(srv), "example.com")
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	secretHost := fmt.Sprintf("example.com:%d", port)
	plainHost := fmt.Sprintf("plain.example.com:%d", port)

	if _, err := h.p.SetShape("sb-x", Shape{Allow: mustAllowlist(t, plainHost), Secrets: []string{"NOPE"}}); err == nil || !strings.Contains(err.Error(), "NOPE") {
		t.Errorf("a secret the proxy does not hold: %v", err)
	}
	if _, err := h.p.SetShape("sb-x", Shape{Allow: mustAllowlist(t, plainHost), Secrets: []string{"TOKEN"}}); err == nil || !strings.Contains(err.Error(), "example.com") {
		t.Errorf("a secret whose host the shape does not allow: %v", err)
	}

	// narrow: only the plain host, no secret.
	clear, err := h.p.SetShape("narrow", Shape{Allow: mustAllowlist(t, plainHost)})
	if err != nil {
		t.Fatal(err)
	}
	narrow := h.serve("narrow")
	if env := h.p.SecretEnv("narrow"); len(env) != 0 {
		t.Errorf("SecretEnv of a sandbox holding no secret = %q", env)
	}
	if resp, body, _ := roundTrip(t, narrow, connectReq(secretHost)); resp.StatusCode != http.StatusForbidden {
		t.Errorf("narrow sandbox to %s: %d %s, want 403 (not on its allowlist)", secretHost, resp.StatusCode, body)
	}
	if resp, body, _ := roundTrip(t, narrow, connectReq(plainHost)); resp.StatusCode != http.StatusOK {
		t.Errorf("narrow sandbox to %s: %d %s, want 200", plainHost, resp.StatusCode, body)
	}
	// The default sandbox keeps the server's allowlist.
	if resp, body, _ := h.connect(secretHost); resp.StatusCode != http.StatusOK {
		t.Errorf("default sandbox to %s: %d %s", secretHost, resp.StatusCode, body)
	}
	clear()
	if resp, body, _ := roundTrip(t, narrow, connectReq(secretHost)); resp.StatusCode != http.StatusOK {
		t.Errorf("after clear, %s: %d %s, want the server's allowlist again", secretHost, resp.StatusCode, body)
	}

	// nosecret: the secret's host allowed, the secret not held: the
	// tunnel is not intercepted, so the upstream's own certificate is what
	// the client sees.
	if _, err := h.p.SetShape("nosecret", Shape{Allow: mustAllowlist(t, secretHost)}); err != nil {
		t.Fatal(err)
	}
	addr := h.serve("nosecret")
	proxyURL, _ := url.Parse("http://" + addr)
	tr := &http.Transport{Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{RootCAs: upstreamRoots(srv)}}
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + secretHost + "/")
	if err != nil {
		t.Fatalf("a sandbox without the secret, to its host: %v (intercepted?)", err)
	}
	resp.Body.Close()
	if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 || !resp.TLS.PeerCertificates[0].Equal(srv.Certificate()) {
		t.Error("the tunnel of a sandbox without the secret was intercepted")
	}

	// holder: the secret held, through SecretEnv.
	if _, err := h.p.SetShape("holder", Shape{Allow: mustAllowlist(t, secretHost), Secrets: []string{"TOKEN"}}); err != nil {
		t.Fatal(err)
	}
	if env := h.p.SecretEnv("holder"); len(env) != 1 || !strings.HasPrefix(env[0], "TOKEN=sbx-secret-TOKEN-") {
		t.Errorf("SecretEnv of a sandbox holding TOKEN = %q", env)
	}
}
