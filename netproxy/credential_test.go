package netproxy

import (
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

func authConnect(target, token string) string {
	auth := base64.StdEncoding.EncodeToString([]byte(CredentialUser + ":" + token))
	return "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\nProxy-Authorization: Basic " + auth + "\r\n\r\n"
}

// TestSharedListenerByCredential: one shared listener serves each sandbox
// by the credential in its request; a request with no credential, a wrong
// one or a revoked one gets 407 and never reaches a lookup or a dial.
func TestSharedListenerByCredential(t *testing.T) {
	h := newHarness(t, Config{})
	h.res.setAddrs("api.example.com", "93.184.216.34")
	h.dialer.target = startServer(t, "tcp", "127.0.0.1:0", echo).addr()
	ln := listen(t)
	h.wg.Go(func() {
		if err := h.p.ServeShared(h.ctx, ln); err != nil {
			t.Errorf("ServeShared: %v", err)
		}
	})
	addr := ln.Addr().String()
	tokA, tokB := NewToken(), NewToken()
	revokeA := h.p.Grant("sb-a", tokA)
	revokeB := h.p.Grant("sb-b", tokB)
	defer revokeB()

	for i, tok := range []string{tokA, tokB} {
		resp, _, c := roundTrip(t, addr, authConnect("api.example.com:443", tok))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("sandbox %d with its credential: %s", i, resp.Status)
		}
		// The tunnel carries bytes (the proxy looks at the first ones).
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping\n" {
			t.Fatalf("tunnel %d: %q %v", i, buf, err)
		}
		c.Close()
		// Each tunnel is charged to the sandbox its credential names.
		if cl := h.waitCloses(i + 1); cl[i].Sandbox != []string{"sb-a", "sb-b"}[i] {
			t.Fatalf("tunnel %d was charged to %q", i, cl[i].Sandbox)
		}
	}
	dials := h.dialer.count()
	for name, raw := range map[string]string{
		"none":  connectReq("api.example.com:443"),
		"wrong": authConnect("api.example.com:443", NewToken()),
		"user":  strings.Replace(authConnect("api.example.com:443", tokA), base64.StdEncoding.EncodeToString([]byte("sbx:"+tokA)), base64.StdEncoding.EncodeToString([]byte("root:"+tokA)), 1),
	} {
		resp, body, _ := roundTrip(t, addr, raw)
		if resp.StatusCode != http.StatusProxyAuthRequired || !strings.Contains(body, "credential") || resp.Header.Get("Proxy-Authenticate") == "" {
			t.Errorf("%s credential: %s %q", name, resp.Status, body)
		}
	}
	revokeA()
	if resp, _, _ := roundTrip(t, addr, authConnect("api.example.com:443", tokA)); resp.StatusCode != http.StatusProxyAuthRequired {
		t.Errorf("revoked credential: %s", resp.Status)
	}
	if h.dialer.count() != dials {
		t.Error("a request without a valid credential was dialed")
	}
}

// TestOwnListenerChecksCredential: a sandbox's own listener that was
// granted a token refuses requests without it (the address check stays).
func TestOwnListenerChecksCredential(t *testing.T) {
	h := newHarness(t, Config{})
	h.res.setAddrs("api.example.com", "93.184.216.34")
	h.dialer.target = startServer(t, "tcp", "127.0.0.1:0", silent).addr()
	tok := NewToken()
	defer h.p.Grant("sandbox-1", tok)()
	if resp, _, _ := h.connect("api.example.com:443"); resp.StatusCode != http.StatusProxyAuthRequired {
		t.Errorf("no credential: %s", resp.Status)
	}
	if resp, _, _ := roundTrip(t, h.addr, authConnect("api.example.com:443", tok)); resp.StatusCode != http.StatusOK {
		t.Errorf("with the credential: %s", resp.Status)
	}
}

func TestProxyURL(t *testing.T) {
	u, err := url.Parse(ProxyURL("10.0.0.1:3128", "abc"))
	if err != nil || u.Scheme != "http" || u.Host != "10.0.0.1:3128" || u.User.Username() != "sbx" {
		t.Fatalf("%v %v", u, err)
	}
	if p, _ := u.User.Password(); p != "abc" {
		t.Fatal(p)
	}
	// What Go's HTTP client sends for such a proxy URL is what the proxy reads.
	req := &http.Request{Header: http.Header{}}
	req.SetBasicAuth(u.User.Username(), "abc")
	h := http.Header{"Proxy-Authorization": req.Header["Authorization"]}
	if got := credential(h); got != "abc" {
		t.Errorf("credential %q", got)
	}
}
