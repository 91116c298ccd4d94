package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

// secretValue is the operator's credential in these tests. The sandbox
// must never see it.
const secretValue = "ghp_TheRealValue_e2e_7f3a9c1b5d"

// testPKI is a test CA and the certificates it signs.
type testPKI struct {
	key   *ecdsa.PrivateKey
	cert  *x509.Certificate
	caPEM string
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sandbox-mcp e2e upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testPKI{key: key, cert: cert, caPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

// leaf issues a server certificate for names, signed by the CA, or
// self-signed when selfSigned.
func (p *testPKI) leaf(t *testing.T, selfSigned bool, names ...string) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	parent, signer := p.cert, p.key
	if selfSigned {
		parent, signer = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// secretsUpstream is an HTTPS server on every address of this host that
// records the Authorization header of each request and answers with its
// digest only (so the sandbox learns nothing from the answer). Under /git/
// it serves a repository with git http-backend, behind Basic auth that
// wants the real value.
type secretsUpstream struct {
	port int
	mu   sync.Mutex
	auth []string // Authorization of each request, in order
}

func (u *secretsUpstream) seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.auth...)
}

func startSecretsUpstream(t *testing.T, cert tls.Certificate, gitRoot string) *secretsUpstream {
	t.Helper()
	u := &secretsUpstream{}
	var git http.Handler
	if gitRoot != "" {
		gitPath, err := exec.LookPath("git")
		if err != nil {
			t.Fatalf("this test serves a repository with the host's git: %v", err)
		}
		git = &cgi.Handler{Path: gitPath, Args: []string{"http-backend"}, Root: "/git",
			Env: []string{"GIT_PROJECT_ROOT=" + gitRoot, "GIT_HTTP_EXPORT_ALL=1"}}
	}
	wantBasic := "Basic " + base64.StdEncoding.EncodeToString([]byte("x:"+secretValue))
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		u.mu.Lock()
		u.auth = append(u.auth, auth)
		u.mu.Unlock()
		if r.URL.Path == "/echo" { // an upstream that reflects the request: the credential and the query
			fmt.Fprintf(w, "%s %s", auth, r.URL.RawQuery)
			return
		}
		if git != nil && strings.HasPrefix(r.URL.Path, "/git/") {
			if auth != wantBasic {
				w.Header().Set("WWW-Authenticate", `Basic realm="e2e"`)
				http.Error(w, "credentials, please", http.StatusUnauthorized)
				return
			}
			git.ServeHTTP(w, r)
			return
		}
		sum := sha256.Sum256([]byte(auth))
		fmt.Fprintf(w, "auth-sha256=%s", hex.EncodeToString(sum[:]))
	})
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	u.port = ln.Addr().(*net.TCPAddr).Port
	srv := &http.Server{Handler: handler, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return u
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// makeRepo makes a bare repository with one commit, for git http-backend.
func makeRepo(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	work := filepath.Join(root, "work")
	for _, args := range [][]string{
		{"init", "-q", "-b", "main", work},
		{"-C", work, "-c", "user.name=e2e", "-c", "user.email=e2e@example.com", "commit", "-q", "--allow-empty", "-m", "the commit behind the secret"},
		{"clone", "-q", "--bare", work, filepath.Join(root, "repo.git")},
	} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	return root
}

// sniProbe opens a tunnel to target through the sandbox's proxy (with the
// sandbox's credential from its proxy URL) and makes
// a TLS handshake naming sni (none if empty), trusting only the test CA.
const sniProbe = `import base64, os, socket, ssl, sys, urllib.parse
target, sni = sys.argv[1], sys.argv[2]
u = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
auth = base64.b64encode(("%s:%s" % (u.username, u.password)).encode()).decode()
s = socket.create_connection((u.hostname, u.port), timeout=10)
s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n" % (target, target, auth)).encode())
resp = b""
while b"\r\n\r\n" not in resp:
    c = s.recv(1)
    if not c:
        break
    resp += c
print(resp.split(b"\r\n")[0].decode())
ctx = ssl.create_default_context(cafile="/workspace/testca.pem")
ctx.check_hostname = False
try:
    t = ctx.wrap_socket(s, server_hostname=sni or None)
    print("handshake ok")
except Exception as e:
    print("handshake failed:", e)
`

// nodeConnect fetches /node from host:port (argv) through HTTPS_PROXY (with
// the sandbox's proxy credential from its URL) with the token from the
// environment, and prints the response body.
const nodeConnect = `const http = require("http"), tls = require("tls");
const proxy = new URL(process.env.HTTPS_PROXY), target = process.argv[2];
const auth = Buffer.from(decodeURIComponent(proxy.username) + ":" + decodeURIComponent(proxy.password)).toString("base64");
http.request({host: proxy.hostname, port: proxy.port, method: "CONNECT", path: target, headers: {"Proxy-Authorization": "Basic " + auth}}).on("connect", (res, sock) => {
  const s = tls.connect({socket: sock, servername: target.split(":")[0]}, () => {
    s.write("GET /node HTTP/1.1\r\nHost: " + target + "\r\nAuthorization: Bearer " + process.env.TOKEN + "\r\nConnection: close\r\n\r\n");
  });
  let data = "";
  s.on("data", c => data += c);
  s.on("end", () => console.log(data.split("\r\n\r\n")[1]));
  s.on("error", e => { console.log("error", e.message); process.exit(1); });
}).end();
`

// TestSecretsThroughTheProxy runs the built server with --secret on the
// default image: curl, git and python's urllib in the sandbox use the
// placeholder, the upstream gets the real value (in Authorization, not in
// the query), an upstream that echoes it gives the sandbox the placeholder
// back, and the value is nowhere in the sandbox, the server's log or the
// audit log. The proxy verifies the
// real host (an untrusted or misnamed certificate is a 502, and nothing
// reaches it); a host without a secret is tunnelled, not intercepted; a
// ClientHello naming another host is refused.
func TestSecretsThroughTheProxy(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	pki := newTestPKI(t)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "testca.pem")
	os.WriteFile(caFile, []byte(pki.caPEM), 0o644)
	good := startSecretsUpstream(t, pki.leaf(t, false, host, "localhost"), makeRepo(t))
	untrusted := startSecretsUpstream(t, pki.leaf(t, true, host), "")
	misnamed := startSecretsUpstream(t, pki.leaf(t, false, "wrong.invalid"), "")
	audit := filepath.Join(dir, "audit.jsonl")

	hp := func(port int) string { return fmt.Sprintf("%s:%d", host, port) }
	startArgs := []string{
		"--network", "allowlist", "--allow-private-networks", "--audit-log", audit,
		"--allow-host", strings.Join([]string{hp(good.port), hp(untrusted.port), hp(misnamed.port), fmt.Sprintf("localhost:%d", good.port)}, ","),
		"--secret", "TOKEN@" + host,
	}
	start := func() *server {
		return startServer(t, serverOpts{image: testenv.DefaultImage(t), args: startArgs,
			env: []string{"TOKEN=" + secretValue, "SSL_CERT_FILE=" + caFile}})
	}
	s := start()
	exec := func(command string) (string, string, float64) {
		t.Helper()
		m := s.ok("sandbox_exec", map[string]any{"argv": []string{"bash", "-c", command}, "timeout_ms": 120000})
		return m["stdout"].(string), m["stderr"].(string), m["exit_code"].(float64)
	}
	s.ok("sandbox_write_file", map[string]any{"path": "testca.pem", "content": pki.caPEM})
	s.ok("sandbox_write_file", map[string]any{"path": "sni.py", "content": sniProbe})

	// The sandbox holds the placeholder and trusts the bundle.
	out, _, _ := exec(`echo "$TOKEN"; echo "$SSL_CERT_FILE $REQUESTS_CA_BUNDLE $NODE_EXTRA_CA_CERTS $GIT_SSL_CAINFO $PIP_CERT $CURL_CA_BUNDLE"`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	placeholder := lines[0]
	if !strings.HasPrefix(placeholder, "sbx-secret-TOKEN-") || lines[1] != strings.TrimSpace(strings.Repeat(agentproto.CABundlePath+" ", 6)) {
		t.Fatalf("the sandbox's TOKEN and CA variables: %q", out)
	}

	// curl with a bearer header.
	out, stderr, rc := exec(fmt.Sprintf(`curl -sS --max-time 20 -H "Authorization: Bearer $TOKEN" https://%s/curl`, hp(good.port)))
	if rc != 0 || out != "auth-sha256="+sha("Bearer "+secretValue) {
		t.Errorf("curl: rc %v, %q %q; want the digest of the real bearer token", rc, out, stderr)
	}
	// An upstream that echoes the request: the value it got comes back as
	// the placeholder, and the placeholder in the query went out unchanged.
	out, stderr, rc = exec(fmt.Sprintf(`curl -sS --max-time 20 -H "Authorization: Bearer $TOKEN" "https://%s/echo?t=$TOKEN"`, hp(good.port)))
	if seen := good.seen(); rc != 0 || out != "Bearer "+placeholder+" t="+placeholder || seen[len(seen)-1] != "Bearer "+secretValue {
		t.Errorf("echo: rc %v, %q %q; want the placeholder back in both places, the real value upstream in Authorization only", rc, out, stderr)
	}
	// python's urllib, reading the token from the environment.
	out, stderr, rc = exec(fmt.Sprintf(`python3 -c 'import os, urllib.request as u; r = u.Request("https://%s/py", headers={"Authorization": "token " + os.environ["TOKEN"]}); print(u.urlopen(r, timeout=20).read().decode())'`, hp(good.port)))
	if rc != 0 || strings.TrimSpace(out) != "auth-sha256="+sha("token "+secretValue) {
		t.Errorf("python urllib: rc %v, %q %q", rc, out, stderr)
	}
	// node, whose https ignores HTTPS_PROXY: a CONNECT by hand, and TLS that
	// trusts the proxy's CA through NODE_EXTRA_CA_CERTS alone.
	s.ok("sandbox_write_file", map[string]any{"path": "connect.js", "content": nodeConnect})
	out, stderr, rc = exec(fmt.Sprintf(`node /workspace/connect.js %s`, hp(good.port)))
	if rc != 0 || strings.TrimSpace(out) != "auth-sha256="+sha("Bearer "+secretValue) {
		t.Errorf("node: rc %v, %q %q", rc, out, stderr)
	}
	// git over https with the placeholder as the URL's password (Basic).
	out, stderr, rc = exec(fmt.Sprintf(`cd /workspace && git clone -q "https://x:$TOKEN@%s/git/repo.git" clone && git -C clone log --format=%%s`, hp(good.port)))
	if rc != 0 || strings.TrimSpace(out) != "the commit behind the secret" {
		t.Errorf("git clone: rc %v, %q %q", rc, out, stderr)
	}
	var sawBasic bool
	for _, a := range good.seen() {
		if a == "Basic "+base64.StdEncoding.EncodeToString([]byte("x:"+secretValue)) {
			sawBasic = true
		}
		if strings.Contains(a, placeholder) {
			t.Errorf("the upstream got the placeholder in %q", a)
		}
	}
	if !sawBasic {
		t.Errorf("the upstream never saw git's Basic credentials with the real value: %q", good.seen())
	}

	// Untrusted and misnamed upstreams: 502, nothing reaches them.
	for name, u := range map[string]*secretsUpstream{"untrusted": untrusted, "misnamed": misnamed} {
		out, _, _ := exec(fmt.Sprintf(`curl -sS --max-time 20 -H "Authorization: Bearer $TOKEN" https://%s/ 2>&1`, hp(u.port)))
		if !strings.Contains(out, "502") {
			t.Errorf("%s upstream: %q, want a 502 from the proxy", name, out)
		}
		if n := len(u.seen()); n != 0 {
			t.Errorf("%s upstream: %d requests reached it", name, n)
		}
	}

	// A host without a secret is tunnelled: the sandbox sees the upstream's
	// own certificate (only the test CA verifies it), and the placeholder
	// arrives unchanged.
	before := len(good.seen())
	out, stderr, rc = exec(fmt.Sprintf(`curl -sS --max-time 20 --noproxy '' --cacert /workspace/testca.pem -H "Authorization: Bearer $TOKEN" https://localhost:%d/plain`, good.port))
	if rc != 0 || out != "auth-sha256="+sha("Bearer "+placeholder) {
		t.Errorf("host without a secret: rc %v, %q %q; want the placeholder's digest", rc, out, stderr)
	}
	if seen := good.seen(); len(seen) != before+1 || seen[before] != "Bearer "+placeholder {
		t.Errorf("host without a secret: the upstream saw %q", seen[before:])
	}

	// The SNI check on tunnels that are not intercepted.
	target := fmt.Sprintf("localhost:%d", good.port)
	for sni, want := range map[string]string{host: "handshake failed", "localhost": "handshake ok", "": "handshake ok"} {
		out, stderr, _ := exec(fmt.Sprintf(`python3 /workspace/sni.py %s '%s'`, target, sni))
		if !strings.Contains(out, "200") || !strings.Contains(out, want) {
			t.Errorf("SNI %q to %s: %q %q, want %q", sni, target, out, stderr, want)
		}
	}
	if log := s.stderr.String(); !strings.Contains(log, fmt.Sprintf(`the TLS ClientHello names \"%s\", not \"localhost\"`, host)) {
		t.Errorf("the server's log does not record the SNI refusal")
	}

	// The value is nowhere in the sandbox: the environment of its
	// processes, /tmp (the CA bundle included), /workspace. Nor is a key.
	// A result shows a bounded part of a command's output: the dump goes to a
	// file, read whole with sandbox_read_file.
	exec(`{ cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n'; find /tmp /workspace -type f ! -name sandbox-dump -print0 2>/dev/null | xargs -0 cat 2>/dev/null; } > /workspace/sandbox-dump`)
	dump := readWhole(t, s, "sandbox-dump")
	if !strings.Contains(dump, placeholder) || !strings.Contains(dump, "sandbox-mcp egress proxy CA") {
		t.Fatalf("the dump of the sandbox lacks the placeholder or the bundle (%d bytes): the check would prove nothing", len(dump))
	}
	if strings.Contains(dump, secretValue) {
		t.Error("the real value is in the sandbox")
	}
	if strings.Contains(dump, "PRIVATE KEY") {
		t.Error("a private key is in the sandbox")
	}
	bundle, _, _ := exec("tail -c 4096 " + agentproto.CABundlePath)
	s.cs.Close()
	// The log and the audit log name the secret's use, never the value.
	a, _ := os.ReadFile(audit)
	if !strings.Contains(string(a), `"event":"secret TOKEN used for `+host+`"`) {
		t.Errorf("the audit log does not record the secret's use:\n%s", a)
	}
	for name, text := range map[string]string{"server log": s.stderr.String(), "audit log": string(a)} {
		if strings.Contains(text, secretValue) {
			t.Errorf("the %s holds the real value", name)
		}
	}

	// Another start of the server makes another CA.
	s = start()
	bundle2, _, _ := exec("tail -c 4096 " + agentproto.CABundlePath)
	ca1, ca2 := lastCert(bundle), lastCert(bundle2)
	if ca1 == "" || ca1 == ca2 {
		t.Errorf("the CA did not change between server starts")
	}
}

// readWhole reads a workspace file with as many sandbox_read_file calls
// as it takes.
func readWhole(t *testing.T, s *server, path string) string {
	t.Helper()
	var b strings.Builder
	for offset := int64(0); ; {
		m := s.ok("sandbox_read_file", map[string]any{"path": path, "byte_offset": offset, "byte_length": 8 << 20})
		content := m["content"].(string)
		if m["encoding"] == "base64" {
			raw, err := base64.StdEncoding.DecodeString(content)
			if err != nil {
				t.Fatal(err)
			}
			content = string(raw)
		}
		b.WriteString(content)
		next, _ := m["next_byte_offset"].(float64)
		if next == 0 || int64(next) <= offset {
			return b.String()
		}
		offset = int64(next)
	}
}

// lastCert returns the last PEM certificate of a bundle.
func lastCert(bundle string) string {
	i := strings.LastIndex(bundle, "-----BEGIN CERTIFICATE-----")
	if i < 0 {
		return ""
	}
	return bundle[i:]
}

// TestSecretsWithPackageManagers: pip with the placeholder in its index
// URL's user info, and npm with it as the registry's auth token, install
// from an index that gets the real value; the packages run.
func TestSecretsWithPackageManagers(t *testing.T) {
	ix := startPackageIndex(t)
	host, _, _ := net.SplitHostPort(ix.host)
	caFile := filepath.Join(t.TempDir(), "ix.pem")
	os.WriteFile(caFile, []byte(ix.caPEM), 0o644)
	s := startServer(t, serverOpts{image: testenv.DefaultImage(t), args: append([]string{
		"--network", "allowlist", "--allow-host", ix.host, "--allow-private-networks",
		"--secret", "INDEX_TOKEN@" + host}, toolboxArgs...),
		env: []string{"INDEX_TOKEN=" + secretValue, "SSL_CERT_FILE=" + caFile}})

	out := s.run(fmt.Sprintf(`pip install --index-url "https://__token__:$INDEX_TOKEN@%s/simple/" sandbox-mcp-probe && python3 -c 'import sandbox_mcp_probe as p; print(p.VALUE)'`, ix.host), nil, 5*time.Minute)
	if !strings.Contains(out["stdout"].(string), ix.token) {
		t.Errorf("pip: the package did not run:\n%s\n%s", out["stdout"], out["stderr"])
	}
	if !ix.sawAuth("Basic " + base64.StdEncoding.EncodeToString([]byte("__token__:"+secretValue))) {
		t.Errorf("pip: the index never got the real value as Basic credentials")
	}
	out = s.run(fmt.Sprintf(`npm config set "//%s/npm/:_authToken" "$INDEX_TOKEN" && mkdir app && cd app && npm install --no-audit --no-fund --registry https://%s/npm/ sandbox-mcp-probe && node -e 'console.log(require("sandbox-mcp-probe"))'`, ix.host, ix.host), nil, 5*time.Minute)
	if !strings.Contains(out["stdout"].(string), ix.token) {
		t.Errorf("npm: the package did not run:\n%s\n%s", out["stdout"], out["stderr"])
	}
	if !ix.sawAuth("Bearer " + secretValue) {
		t.Errorf("npm: the index never got the real value as a bearer token")
	}
	ix.mu.Lock()
	auths := slices.Clone(ix.auth)
	ix.mu.Unlock()
	for _, a := range auths {
		if strings.Contains(a, "sbx-secret-") {
			t.Errorf("the index got a placeholder: %q", a)
		}
	}
	if strings.Contains(s.stderr.String(), secretValue) {
		t.Error("the server's log holds the value")
	}
}
