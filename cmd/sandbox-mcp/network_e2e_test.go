package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

// tlsUpstream is an HTTPS server for this host's name on every address of
// this host, with its own CA, counting the requests it serves. The name is
// the host name: sandboxes exempt "localhost" from the proxy (NO_PROXY), and
// the test needs a name the proxy resolves to an address of this host.
type tlsUpstream struct {
	name   string
	port   int
	caPEM  string
	served atomic.Int64
}

func startTLSUpstream(t *testing.T) *tlsUpstream {
	t.Helper()
	name, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := (&net.Resolver{PreferGo: true}).LookupNetIP(context.Background(), "ip", name)
	if err != nil || len(addrs) == 0 || !(addrs[0].IsLoopback() || addrs[0].IsPrivate()) {
		t.Fatalf("this test needs the host name %q to resolve to a loopback or private address of this host (/etc/hosts): %v %v", name, addrs, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		DNSNames:              []string{name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	u := &tlsUpstream{name: name, caPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	u.port = ln.Addr().(*net.TCPAddr).Port
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u.served.Add(1)
			fmt.Fprintf(w, "hello from upstream %s", r.URL.Path)
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return u
}

func hostAddr(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("sh", "-c", "ip -4 -o route get 1.1.1.1 | sed -n 's/.* src \\([0-9.]*\\).*/\\1/p'").Output()
	ip := strings.TrimSpace(string(out))
	if err != nil || ip == "" {
		t.Fatalf("no host address: %v", err)
	}
	return ip
}

// TestEgressWithCurl: curl in a sandbox of the default image reaches an
// allowed name through the proxy and nothing else.
func TestEgressWithCurl(t *testing.T) {
	up := startTLSUpstream(t)
	allowed := fmt.Sprintf("%s:%d", up.name, up.port)
	s := startServer(t, serverOpts{image: testenv.DefaultImage(t), args: []string{
		"--network", "allowlist", "--allow-host", allowed, "--allow-private-networks",
	}})
	s.ok("sandbox_write_file", map[string]any{"path": "ca.pem", "content": up.caPEM})
	curl := func(args ...string) map[string]any {
		return s.ok("sandbox_exec", map[string]any{"argv": append([]string{"curl", "-sS", "--max-time", "10", "--cacert", "ca.pem"}, args...)})
	}
	out := curl("https://" + allowed + "/through-the-proxy")
	if out["exit_code"].(float64) != 0 || out["stdout"] != "hello from upstream /through-the-proxy" {
		t.Fatalf("allowed name: %v", out)
	}
	out = curl("https://example.com/")
	if out["exit_code"].(float64) == 0 || !strings.Contains(out["stderr"].(string), "403") {
		t.Fatalf("unlisted name: %v", out)
	}
	// The allowed host on another port is another host:port.
	out = curl(fmt.Sprintf("https://%s:%d/", up.name, up.port+1))
	if out["exit_code"].(float64) == 0 || !strings.Contains(out["stderr"].(string), "403") {
		t.Fatalf("allowed name, other port: %v", out)
	}
	// Plain HTTP is refused with a sentence saying to use https.
	out = curl("http://" + allowed + "/")
	if !strings.Contains(out["stdout"].(string), "use an https:// URL") {
		t.Fatalf("plain http: %v", out)
	}
	// Direct connections, bypassing the proxy, go nowhere.
	before := up.served.Load()
	out = curl("--noproxy", "*", "--connect-timeout", "3", fmt.Sprintf("https://%s:%d/", hostAddr(t), up.port))
	if out["exit_code"].(float64) == 0 {
		t.Fatalf("direct connection to the host: %v", out)
	}
	out = s.ok("sandbox_exec", map[string]any{"argv": []string{"bash", "-c", "getent hosts example.com; echo rc=$?"}})
	if !strings.Contains(out["stdout"].(string), "rc=2") {
		t.Fatalf("the sandbox resolved a name: %v", out)
	}
	if up.served.Load() != before {
		t.Fatal("the upstream served a direct request")
	}
}

func TestEgressPrivateNeedsTheFlag(t *testing.T) {
	up := startTLSUpstream(t)
	allowed := fmt.Sprintf("%s:%d", up.name, up.port)
	s := startServer(t, serverOpts{image: testenv.DefaultImage(t), args: []string{"--network", "allowlist", "--allow-host", allowed}})
	s.ok("sandbox_write_file", map[string]any{"path": "ca.pem", "content": up.caPEM})
	out := s.ok("sandbox_exec", map[string]any{"argv": []string{"curl", "-sS", "--max-time", "10", "--cacert", "ca.pem", "https://" + allowed + "/"}})
	if out["exit_code"].(float64) == 0 || !strings.Contains(out["stderr"].(string), "403") {
		t.Fatalf("an allowed name resolving to loopback without --allow-private-networks: %v", out)
	}
	if up.served.Load() != 0 {
		t.Fatal("the upstream was reached")
	}
	if !strings.Contains(s.stderr.String(), "proxy decision") {
		t.Fatal("no proxy decision in the log")
	}
}

func TestNetworkFlagsValidated(t *testing.T) {
	for args, want := range map[string]string{
		"--network=allowlist":                "no --allow-host",
		"--network=allowlist --allow-host=*": "--allow-host",
		"--allow-host=example.com":           "--network=allowlist",
		"--allow-private-networks":           "needs --network=allowlist",
		"--network=allowlist --allow-host=a.com --network-pool=10.0.0.0/30": "--network-pool",
	} {
		_, err := ParseConfig(strings.Fields(args), envFrom(map[string]string{"HOME": t.TempDir()}))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want it to mention %q", args, err, want)
		}
	}
}
