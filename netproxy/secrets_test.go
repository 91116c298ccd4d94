package netproxy

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

const testSecret = "real-Secret-value-0123456789"

func TestParseSecretSpec(t *testing.T) {
	good := []struct {
		spec string
		want Secret
	}{
		{"GITHUB_TOKEN@github.com", Secret{Name: "GITHUB_TOKEN", Hosts: []string{"github.com"}}},
		{"T@GitHub.com.,api.github.com, github.com", Secret{Name: "T", Hosts: []string{"github.com", "api.github.com"}}},
		{"_x@localhost", Secret{Name: "_x", Hosts: []string{"localhost"}}},
		{"K@api.example.com:header=x-api-key:header=X-Api-Key:header=Authorization",
			Secret{Name: "K", Hosts: []string{"api.example.com"}, Headers: []string{"X-Api-Key"}}},
		{"M@maps.example.com:url", Secret{Name: "M", Hosts: []string{"maps.example.com"}, InURL: true}},
		{"G@a.test,b.test:header=Private-Token:url", Secret{Name: "G", Hosts: []string{"a.test", "b.test"}, Headers: []string{"Private-Token"}, InURL: true}},
	}
	for _, g := range good {
		got, err := ParseSecretSpec(g.spec)
		if err != nil || got.Name != g.want.Name || got.Value != "" || got.InURL != g.want.InURL ||
			strings.Join(got.Hosts, ",") != strings.Join(g.want.Hosts, ",") || strings.Join(got.Headers, ",") != strings.Join(g.want.Headers, ",") {
			t.Errorf("ParseSecretSpec(%q) = %+v %v, want %+v", g.spec, got, err, g.want)
		}
	}
	bad := map[string]string{
		"TOKEN":                           "NAME@HOST",
		"TOKEN@":                          "NAME@HOST",
		"@github.com":                     "NAME@HOST",
		"1TOKEN@github.com":               "not a valid variable name",
		"TOKEN@*.github.com":              "wildcard",
		"TOKEN@github.com:443":            "takes no port",
		"TOKEN@github.com/x":              "has a path",
		"TOKEN@127.0.0.1":                 "IP address",
		"TOKEN@github.com,bad!x":          "bad!x",
		"TOKEN@github.com:":               "empty option",
		"TOKEN@github.com:query":          `unknown option "query"`,
		"TOKEN@github.com:header=":        "is empty",
		"TOKEN@github.com:header=Host":    "frames or routes",
		"TOKEN@github.com:header=Cookie:": `unknown option ""`,
		"TOKEN@github.com:header=a b":     "not a header field name",
	}
	for spec, want := range bad {
		_, err := ParseSecretSpec(spec)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseSecretSpec(%q) = %v, want an error saying %q", spec, err, want)
		}
	}
}

func TestNewChecksSecrets(t *testing.T) {
	allow := mustAllowlist(t, "api.example.com", "*.example.org")
	cases := map[string]Secret{
		"not on the --allow-host list": {Name: "T", Value: "secret-v-123", Hosts: []string{"other.example.com"}},
		"value is empty":               {Name: "T", Hosts: []string{"api.example.com"}},
		"line break":                   {Name: "T", Value: "a\r\nX-Injected: 1", Hosts: []string{"api.example.com"}},
		"names no host":                {Name: "T", Value: "secret-v-123"},
		"valid variable name":          {Name: "T-1", Value: "secret-v-123", Hosts: []string{"api.example.com"}},
		"shorter than 8 bytes":         {Name: "T", Value: "Zq9x", Hosts: []string{"api.example.com"}},
		"frames or routes":             {Name: "T", Value: "secret-v-123", Hosts: []string{"api.example.com"}, Headers: []string{"content-length"}},
	}
	for want, s := range cases {
		_, err := New(Config{Allow: allow, Secrets: []Secret{s}})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New with %+v = %v, want an error saying %q", s.Hosts, err, want)
		}
		if err != nil && s.Value != "" && strings.Contains(err.Error(), s.Value) {
			t.Errorf("the error quotes the value: %v", err)
		}
	}
	// A host under an allowed wildcard is allowed.
	if _, err := New(Config{Allow: allow, Secrets: []Secret{{Name: "T", Value: "secret-v-123", Hosts: []string{"pkg.example.org"}}}}); err != nil {
		t.Error(err)
	}
	if _, err := New(Config{Allow: allow, Secrets: []Secret{{Name: "T", Value: "secret-v-123", Hosts: []string{"api.example.com"}}, {Name: "T", Value: "secret-w-123", Hosts: []string{"api.example.com"}}}}); err == nil {
		t.Error("a secret given twice was accepted")
	}
}

func TestPlaceholdersAndCA(t *testing.T) {
	cfg := Config{Allow: mustAllowlist(t, "api.example.com"), Secrets: []Secret{
		{Name: "A", Value: testSecret, Hosts: []string{"api.example.com"}},
		{Name: "B", Value: "other-value-1", Hosts: []string{"api.example.com"}},
	}}
	p1, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p2, _ := New(cfg)
	e1, e1b, e2 := p1.SecretEnv("sb-1"), p1.SecretEnv("sb-2"), p2.SecretEnv("sb-1")
	if len(e1) != 2 || !strings.HasPrefix(e1[0], "A=sbx-secret-A-") || !strings.HasPrefix(e1[1], "B=sbx-secret-B-") {
		t.Fatalf("SecretEnv = %q", e1)
	}
	if len(e1[0]) != len("A=sbx-secret-A-")+26 {
		t.Errorf("placeholder %q: want 26 random characters", e1[0])
	}
	if again := p1.SecretEnv("sb-1"); again[0] != e1[0] {
		t.Error("a sandbox's placeholder changed")
	}
	if e1[0] == e1b[0] || e1[0] == e2[0] {
		t.Errorf("placeholders repeat across sandboxes or server starts: %q %q %q", e1[0], e1b[0], e2[0])
	}
	for _, e := range append(e1, e2...) {
		if strings.Contains(e, testSecret) {
			t.Errorf("the placeholder holds the value: %q", e)
		}
	}

	c1, c2 := p1.CACert(), p2.CACert()
	if bytes.Equal(c1, c2) {
		t.Error("two proxies made the same CA")
	}
	blk, rest := pem.Decode(c1)
	if blk == nil || blk.Type != "CERTIFICATE" || len(bytes.TrimSpace(rest)) != 0 {
		t.Fatalf("CACert is not one PEM certificate: %q", c1)
	}
	if bytes.Contains(c1, []byte("PRIVATE")) {
		t.Error("CACert holds a key")
	}
	ca, err := x509.ParseCertificate(blk.Bytes)
	if err != nil || !ca.IsCA {
		t.Fatalf("CA certificate: %v %+v", err, ca)
	}
	leaf, err := p1.ca.leaf("api.example.com", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := p1.ca.leaf("api.example.com", time.Now()); again != leaf {
		t.Error("the leaf was not cached")
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: pool}); err != nil {
		t.Errorf("the leaf does not verify against the CA: %v", err)
	}
	if life := leaf.Leaf.NotAfter.Sub(leaf.Leaf.NotBefore); life > 25*time.Hour {
		t.Errorf("the leaf lives %v, want about a day", life)
	}
	if later, _ := p1.ca.leaf("api.example.com", time.Now().Add(leafLifetime)); later == leaf {
		t.Error("an expiring leaf was reused")
	}
	if (&Proxy{}).CACert() != nil || (&Proxy{}).SecretEnv("x") != nil {
		t.Error("a proxy without secrets has a CA or placeholders")
	}
}

func TestRewriter(t *testing.T) {
	s, err := newSecretSet([]Secret{
		{Name: "A", Value: "valueA-0123", Hosts: []string{"a.test"}, Headers: []string{"x-api-key"}},
		{Name: "B", Value: "valueB-0123", Hosts: []string{"b.test"}},
		{Name: "U", Value: "valueU-0123", Hosts: []string{"a.test"}, InURL: true},
	}, mustAllowlist(t, "a.test", "b.test"))
	if err != nil {
		t.Fatal(err)
	}
	rw := s.rewriter("sb", "a.test", nil)
	phA, phB, phU, phOther := s.placeholder("sb", "A"), s.placeholder("sb", "B"), s.placeholder("sb", "U"), s.placeholder("other", "A")
	used := make([]bool, 2)
	if got := rw.replaceHeader("Authorization", "Bearer "+phA, used); got != "Bearer valueA-0123" || !used[0] {
		t.Errorf("bearer: %q %v", got, used)
	}
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("x:"+phA))
	if got := rw.replaceHeader("Authorization", basic, used); got != "Basic "+base64.StdEncoding.EncodeToString([]byte("x:valueA-0123")) {
		t.Errorf("basic: %q", got)
	}
	if got := rw.replaceHeader("X-Api-Key", phA, used); got != "valueA-0123" {
		t.Errorf("a header the secret names: %q", got)
	}
	used[0] = false
	for _, v := range []string{"Bearer " + phB, phOther, "Basic " + base64.StdEncoding.EncodeToString([]byte("x:"+phB))} {
		if got := rw.replaceHeader("Authorization", v, used); got != v || used[0] {
			t.Errorf("%q became %q: another host's or sandbox's placeholder was replaced", v, got)
		}
	}
	for _, k := range []string{"X-Token", "Cookie", "User-Agent", "Referer"} {
		if got := rw.replaceHeader(k, "t="+phA, used); got != "t="+phA || used[0] {
			t.Errorf("%s: %q, want the placeholder unchanged in a header the secret does not name", k, got)
		}
	}
	if got := rw.replaceHeader("X-Api-Key", phU, used); got != phU || used[1] {
		t.Errorf("U's placeholder in A's header: %q", got)
	}
	uri := "/p/" + phA + "?a=" + phA + "&u=" + phU
	if got := rw.replaceURL(uri, used); got != "/p/"+phA+"?a="+phA+"&u=valueU-0123" || used[0] || !used[1] {
		t.Errorf("request target %q became %q %v: only the secret with InURL goes into the URL", uri, got, used)
	}
	if got := rw.scrub.scrubString("https://x:valueA-0123@a.test/?u=valueU%2d0123"); got != "https://x:"+phA+"@a.test/?u="+phU {
		t.Errorf("scrub: %q", got)
	}
	if got := s.scrub("oops valueA-0123 and valueB-0123"); got != "oops [secret A] and [secret B]" {
		t.Errorf("scrub: %q", got)
	}
}

// seen is what a test upstream saw of one request.
type seen struct {
	method, uri, host, auth, token string
	body                           int
}

// secretUpstream is an HTTPS server on loopback (its certificate names
// example.com) that records each request and answers with a digest of its
// Authorization header, never the header itself, plus a redirect-style
// header that carries the real value.
func secretUpstream(t *testing.T) (*httptest.Server, func() []seen) {
	var mu sync.Mutex
	var got []seen
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		mu.Lock()
		got = append(got, seen{r.Method, r.RequestURI, r.Host, r.Header.Get("Authorization"), r.Header.Get("X-Token"), int(n)})
		mu.Unlock()
		sum := sha256.Sum256([]byte(r.Header.Get("Authorization")))
		w.Header().Set("X-Auth-Digest", hex.EncodeToString(sum[:]))
		w.Header().Set("X-Echo-Token", r.Header.Get("X-Token"))
		if r.URL.Path == "/big" {
			w.Write(bytes.Repeat([]byte("d"), 1<<20))
			return
		}
		fmt.Fprintf(w, "%d bytes", n)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return append([]seen(nil), got...)
	}
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// secretHarness runs a proxy with a secret for example.com (the upstream)
// and returns an HTTP client that goes through it, trusting its CA.
func secretHarness(t *testing.T, srv *httptest.Server, roots *x509.CertPool, host string) (*harness, *http.Client, *[]SecretUse) {
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	var mu sync.Mutex
	uses := &[]SecretUse{}
	h := newHarness(t, Config{
		AllowPrivate: true,
		Allow:        mustAllowlist(t, fmt.Sprintf("%s:%d", host, port), fmt.Sprintf("plain.example.com:%d", port)),
		Secrets:      []Secret{{Name: "TOKEN", Value: testSecret, Hosts: []string{host}, Headers: []string{"X-Token"}}},
		RootCAs:      roots,
		OnSecretUse: func(u SecretUse) {
			mu.Lock()
			defer mu.Unlock()
			*uses = append(*uses, u)
		},
	}, realDialer)
	h.res.setAddrs(host, "127.0.0.1")
	h.res.setAddrs("plain.example.com", "127.0.0.1")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.p.CACert())
	proxyURL, _ := url.Parse("http://" + h.addr)
	tr := &http.Transport{Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{RootCAs: pool}}
	t.Cleanup(tr.CloseIdleConnections)
	return h, &http.Client{Transport: tr, Timeout: 10 * time.Second}, uses
}

func upstreamRoots(srv *httptest.Server) *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return pool
}

// TestInterceptInjectsSecret: requests to the secret's host carry the real
// value where the sandbox wrote its placeholder in a credential (bearer
// header, Basic credentials from the URL, a header the secret names), but
// not in the query, which keeps the placeholder; over one kept-alive tunnel with
// bodies streamed both ways; the sandbox never receives the value, and
// neither the logs nor the records hold it.
func TestInterceptInjectsSecret(t *testing.T) {
	srv, got := secretUpstream(t)
	h, client, uses := secretHarness(t, srv, upstreamRoots(srv), "example.com")
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	ph := strings.TrimPrefix(h.p.SecretEnv("sandbox-1")[0], "TOKEN=")
	other := strings.TrimPrefix(h.p.SecretEnv("sandbox-2")[0], "TOKEN=")
	base := fmt.Sprintf("https://example.com:%d", port)

	do := func(req *http.Request) *http.Response {
		t.Helper()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	req, _ := http.NewRequest("GET", base+"/a?token="+ph, nil)
	req.Header.Set("Authorization", "Bearer "+ph)
	req.Header.Set("X-Token", "t="+ph)
	resp := do(req)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Header.Get("X-Auth-Digest") != digest("Bearer "+testSecret) {
		t.Errorf("the upstream did not see the real bearer token")
	}
	if e := resp.Header.Get("X-Echo-Token"); e != "t="+ph {
		t.Errorf("a response header carrying the value reached the sandbox as %q, want the placeholder back", e)
	}

	req, _ = http.NewRequest("POST", strings.Replace(base, "https://", "https://x:"+ph+"@", 1)+"/b", bytes.NewReader(bytes.Repeat([]byte("u"), 1<<20)))
	resp = do(req)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != fmt.Sprintf("%d bytes", 1<<20) {
		t.Errorf("POST body: upstream answered %q", body)
	}
	req, _ = http.NewRequest("GET", base+"/big", nil)
	req.Header.Set("Authorization", "Bearer "+other)
	resp = do(req)
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if n != 1<<20 {
		t.Errorf("streamed %d bytes down, want %d", n, 1<<20)
	}

	s := got()
	if len(s) != 3 {
		t.Fatalf("upstream saw %d requests, want 3", len(s))
	}
	if s[0].uri != "/a?token="+ph || s[0].auth != "Bearer "+testSecret || s[0].token != "t="+testSecret || s[0].host != fmt.Sprintf("example.com:%d", port) {
		t.Errorf("first request as seen upstream: %+v", s[0])
	}
	if s[1].auth != "Basic "+base64.StdEncoding.EncodeToString([]byte("x:"+testSecret)) || s[1].body != 1<<20 {
		t.Errorf("Basic credentials or body as seen upstream: %+v", s[1])
	}
	if s[2].auth != "Bearer "+other {
		t.Errorf("another sandbox's placeholder was not forwarded unchanged: %+v", s[2])
	}
	if ds := h.decisionList(); len(ds) != 1 || !ds[0].Allow || !strings.Contains(ds[0].Reason, "intercepted") {
		t.Errorf("decisions %+v: want one tunnel for three requests, marked intercepted", ds)
	}
	if len(*uses) != 1 || (*uses)[0] != (SecretUse{Sandbox: "sandbox-1", Name: "TOKEN", Host: "example.com", Port: port}) {
		t.Errorf("secret uses %+v, want one for TOKEN on example.com", *uses)
	}
	client.Transport.(*http.Transport).CloseIdleConnections()
	cl := h.waitCloses(1)[0]
	if cl.BytesUp < 1<<20 || cl.BytesDown < 1<<20 {
		t.Errorf("close %+v: want over 1 MiB each way", cl)
	}
	if logs := h.logs.String(); strings.Contains(logs, testSecret) || len(h.logs.records(t, "proxy secret used")) != 1 {
		t.Errorf("logs hold the value, or not one 'proxy secret used' record:\n%s", logs)
	}
}

// TestInterceptVerifiesUpstream: an upstream whose certificate the proxy
// does not trust, or that names another host, gets no request: the sandbox
// gets a 502 that says why.
func TestInterceptVerifiesUpstream(t *testing.T) {
	for name, c := range map[string]struct {
		roots *x509.CertPool
		host  string
		want  string
	}{
		"untrusted":  {x509.NewCertPool(), "example.com", "unknown authority"},
		"wrong name": {nil, "wrong.test", "not wrong.test"},
	} {
		t.Run(name, func(t *testing.T) {
			srv, got := secretUpstream(t)
			roots := c.roots
			if roots == nil {
				roots = upstreamRoots(srv)
			}
			h, _, _ := secretHarness(t, srv, roots, c.host)
			port := srv.Listener.Addr().(*net.TCPAddr).Port
			resp, body, _ := h.connect(fmt.Sprintf("%s:%d", c.host, port))
			if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, c.want) || !strings.Contains(body, "nothing was sent") {
				t.Errorf("%s: %q, want 502 saying %q", resp.Status, body, c.want)
			}
			if n := len(got()); n != 0 {
				t.Errorf("the upstream saw %d requests", n)
			}
		})
	}
}

// TestInterceptRefusesOtherSNI: the sandbox's TLS handshake with the proxy
// must name the CONNECT target (or nothing).
func TestInterceptRefusesOtherSNI(t *testing.T) {
	srv, got := secretUpstream(t)
	h, _, _ := secretHarness(t, srv, upstreamRoots(srv), "example.com")
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	resp, _, c := h.connect(fmt.Sprintf("example.com:%d", port))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "evil.example", InsecureSkipVerify: true})
	if err := tc.Handshake(); err == nil {
		t.Error("a handshake naming another host succeeded")
	}
	if n := len(got()); n != 0 {
		t.Errorf("the upstream saw %d requests", n)
	}
}

// clientHelloBytes captures the first flight of a Go TLS client.
func clientHelloBytes(t *testing.T, serverName string) []byte {
	a, b := net.Pipe()
	go func() {
		tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: true}).Handshake()
	}()
	defer a.Close()
	defer b.Close()
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hdr [5]byte
	if _, err := io.ReadFull(b, hdr[:]); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(b, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr[:], body...)
}

func TestReadClientHello(t *testing.T) {
	hello := clientHelloBytes(t, "api.example.com")
	h, err := readClientHello(bytes.NewReader(append(hello, "after"...)))
	if err != nil || !h.tls || h.sni != "api.example.com" || !bytes.Equal(h.raw, hello) {
		t.Errorf("one record: %v %+v", err, h.sni)
	}
	// The same hello split over two records.
	msg := hello[5:]
	split := append([]byte{0x16, 3, 1, 0, 10}, msg[:10]...)
	rest := msg[10:]
	split = append(split, 0x16, 3, 1, byte(len(rest)>>8), byte(len(rest)))
	split = append(split, rest...)
	if h, err := readClientHello(bytes.NewReader(split)); err != nil || h.sni != "api.example.com" || !bytes.Equal(h.raw, split) {
		t.Errorf("two records: %v %q", err, h.sni)
	}
	if h, err := readClientHello(bytes.NewReader(clientHelloBytes(t, "127.0.0.1"))); err != nil || !h.tls || h.sni != "" {
		t.Errorf("no SNI (an IP server name is not sent): %v %q", err, h.sni)
	}
	if h, err := readClientHello(strings.NewReader("SSH-2.0-x\r\n")); err != nil || h.tls || string(h.raw) != "S" {
		t.Errorf("not TLS: %v %+v", err, h)
	}
	for name, b := range map[string][]byte{
		"not a client hello": {0x16, 3, 1, 0, 4, 2, 0, 0, 0},
		"bad version":        {0x16, 9, 1, 0, 4, 1, 0, 0, 0},
		"truncated body":     append([]byte{0x16, 3, 1, 0, 8, 1, 0, 0, 4}, 3, 3, 0, 0),
		"alert in between":   append(append([]byte{0x16, 3, 1, 0, 10}, msg[:10]...), 0x15, 3, 3, 0, 2, 2, 40),
	} {
		if _, err := readClientHello(bytes.NewReader(b)); err != errBadHello {
			t.Errorf("%s: %v, want errBadHello", name, err)
		}
	}
	if _, err := readClientHello(bytes.NewReader(hello[:20])); err != io.EOF {
		t.Errorf("cut short: %v, want EOF", err)
	}
}

// TestTunnelSNICheck: a tunnel that is not intercepted is refused when its
// ClientHello names another host than the CONNECT target; no SNI and the
// matching name pass, and the sandbox sees the upstream's own certificate.
func TestTunnelSNICheck(t *testing.T) {
	srv, got := secretUpstream(t)
	h, _, _ := secretHarness(t, srv, upstreamRoots(srv), "example.com")
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	target := fmt.Sprintf("plain.example.com:%d", port)

	// Another name than the target: an alert, a 403 record, nothing sent on.
	resp, _, c := h.connect(target)
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "example.com", RootCAs: upstreamRoots(srv)})
	if err := tc.Handshake(); err == nil || !strings.Contains(err.Error(), "access denied") {
		t.Errorf("fronted handshake: %v, want an access denied alert", err)
	}
	var refused bool
	for _, d := range h.decisionList() {
		refused = refused || !d.Allow && d.Status == 403 && strings.Contains(d.Reason, `names "example.com", not "plain.example.com"`)
	}
	if !refused {
		t.Errorf("decisions %+v: want a 403 naming both hosts", h.decisionList())
	}

	// No SNI passes, and the certificate is the upstream's own.
	for _, sni := range []string{"", "plain.example.com"} {
		resp, _, c := h.connect(target)
		if resp.StatusCode != 200 {
			t.Fatal(resp.Status)
		}
		cfg := &tls.Config{InsecureSkipVerify: true, ServerName: sni}
		if sni == "" {
			cfg.ServerName = "127.0.0.1" // an IP is never sent as SNI
		}
		tc := tls.Client(c, cfg)
		if err := tc.Handshake(); err != nil {
			t.Fatalf("SNI %q: %v", sni, err)
		}
		if !tc.ConnectionState().PeerCertificates[0].Equal(srv.Certificate()) {
			t.Errorf("SNI %q: the sandbox did not see the upstream's own certificate", sni)
		}
		ph := strings.TrimPrefix(h.p.SecretEnv("sandbox-1")[0], "TOKEN=")
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: plain.example.com\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", ph)
		io.Copy(io.Discard, tc)
		s := got()
		if len(s) == 0 || s[len(s)-1].auth != "Bearer "+ph {
			t.Errorf("SNI %q: the placeholder did not arrive unchanged: %+v", sni, s)
		}
	}
}

// TestInterceptRedialsAndIdles: when the host closes its connection between
// requests, the next request goes over a new, verified connection to the
// same address; an intercepted tunnel with nothing moving ends at the idle
// time.
func TestInterceptRedialsAndIdles(t *testing.T) {
	var mu sync.Mutex
	conns := 0
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")                    // one request per connection
		io.WriteString(w, digest(r.Header.Get("Authorization"))) // the value itself would come back as the placeholder
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	srv.StartTLS()
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	h := newHarness(t, Config{
		AllowPrivate: true, IdleTimeout: 300 * time.Millisecond,
		Allow:   mustAllowlist(t, fmt.Sprintf("example.com:%d", port)),
		Secrets: []Secret{{Name: "TOKEN", Value: testSecret, Hosts: []string{"example.com"}}},
		RootCAs: upstreamRoots(srv),
	}, realDialer)
	h.res.setAddrs("example.com", "127.0.0.1")
	ph := strings.TrimPrefix(h.p.SecretEnv("sandbox-1")[0], "TOKEN=")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.p.CACert())

	resp, _, c := h.connect(fmt.Sprintf("example.com:%d", port))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "example.com", RootCAs: pool})
	br := bufio.NewReader(tc)
	for i := range 2 {
		// The client keeps its connection to the proxy; the host does not.
		fmt.Fprintf(tc, "GET /%d HTTP/1.1\r\nHost: example.com\r\nAuthorization: Bearer %s\r\n\r\n", i, ph)
		r, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		body, _ := io.ReadAll(r.Body)
		if string(body) != digest("Bearer "+testSecret) {
			t.Errorf("request %d: the host did not see the real value", i)
		}
	}
	mu.Lock()
	n := conns
	mu.Unlock()
	if n != 2 {
		t.Errorf("the host saw %d connections, want 2 (one per request)", n)
	}
	if cl := h.waitCloses(1)[0]; cl.Reason != CloseIdle {
		t.Errorf("close %+v, want idle", cl)
	}
}

// TestInterceptAbsoluteForm: a request in absolute form is forwarded like
// any other (its query keeps its placeholder), and its user info is not
// sent.
func TestInterceptAbsoluteForm(t *testing.T) {
	srv, got := secretUpstream(t)
	h, _, _ := secretHarness(t, srv, upstreamRoots(srv), "example.com")
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	ph := strings.TrimPrefix(h.p.SecretEnv("sandbox-1")[0], "TOKEN=")
	resp, _, c := h.connect(fmt.Sprintf("example.com:%d", port))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.p.CACert())
	tc := tls.Client(c, &tls.Config{ServerName: "example.com", RootCAs: pool})
	fmt.Fprintf(tc, "GET https://u:%s@example.com:%d/abs?t=%s HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n", ph, port, ph)
	r, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	s := got()
	if len(s) != 1 || s[0].uri != "/abs?t="+ph || s[0].auth != "" {
		t.Errorf("the upstream saw %+v", s)
	}
}

// TestInterceptRedialIsRateLimited: the connections an intercepted tunnel
// opens to its host count against the sandbox's request rate.
func TestInterceptRedialIsRateLimited(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	h := newHarness(t, Config{
		AllowPrivate: true, Rate: 0.01, Burst: 2, // the CONNECT and one more
		Allow:   mustAllowlist(t, fmt.Sprintf("example.com:%d", port)),
		Secrets: []Secret{{Name: "TOKEN", Value: testSecret, Hosts: []string{"example.com"}}},
		RootCAs: upstreamRoots(srv),
	}, realDialer)
	h.res.setAddrs("example.com", "127.0.0.1")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.p.CACert())
	resp, _, c := h.connect(fmt.Sprintf("example.com:%d", port))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "example.com", RootCAs: pool})
	br := bufio.NewReader(tc)
	var bodies []string
	for i := range 3 {
		fmt.Fprintf(tc, "GET /%d HTTP/1.1\r\nHost: example.com\r\n\r\n", i)
		r, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, _ := io.ReadAll(r.Body)
		bodies = append(bodies, fmt.Sprintf("%d %s", r.StatusCode, b))
	}
	if bodies[0] != "200 ok" || bodies[1] != "200 ok" || !strings.HasPrefix(bodies[2], "502 ") || !strings.Contains(bodies[2], "faster than") {
		t.Errorf("answers %q: want two served (the tunnel's connection and one new one), then a 502 for the rate", bodies)
	}
}
