package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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

// TestSandboxCannotReachTheMCPPort (HTTP case 20 and proxy case 51 of
// docs/attack-cases.md): with
// the server listening on every interface, a sandbox with a network still
// cannot reach its port, on the gateway or on the host's own address.
func TestSandboxCannotReachTheMCPPort(t *testing.T) {
	token := "test-token-0123456789abcdef"
	name, _ := os.Hostname()
	h := startHTTP(t, httpOpts{addr: "0.0.0.0:0", args: []string{"--network", "allowlist", "--allow-host", name + ":1"},
		env: []string{"SANDBOX_MCP_TOKEN=" + token}})
	s := h.connect(token)
	script := fmt.Sprintf(`p=${HTTPS_PROXY##*@}; gw=${p%%:*}
for target in "$gw %[1]s" "%[2]s %[1]s"; do
  printf 'GET /healthz HTTP/1.0\r\n\r\n' | nc -w 2 $target && echo "REACHED $target"
done; true`, h.port, hostAddr(t))
	out := s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", script}})
	if strings.Contains(out["stdout"].(string), "REACHED") || strings.Contains(out["stdout"].(string), "200 OK") {
		t.Fatalf("a sandbox reached the MCP port:\n%s", out["stdout"])
	}
	// The port itself answers from the host, so the refusal is the firewall's.
	if r := h.do("GET", "/healthz", nil, ""); r.status != 200 {
		t.Fatalf("healthz from the host: %d", r.status)
	}
}

// TestProxyDecisionsAudited: every proxy decision is an audit record that
// names the sandbox, host, port, resolved address and reason.
func TestProxyDecisionsAudited(t *testing.T) {
	name, _ := os.Hostname()
	up, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := up.Addr().(*net.TCPAddr).Port
	audit := filepath.Join(t.TempDir(), "audit.jsonl")
	s := startServer(t, serverOpts{args: []string{"--network", "allowlist", "--allow-host", fmt.Sprintf("%s:%d", name, port),
		"--allow-private-networks", "--audit-log", audit}})
	connect := func(target string) string {
		script := fmt.Sprintf(`p=${HTTPS_PROXY#http://}; auth=$(printf %%s "${p%%@*}" | base64); p=${p#*@}; printf 'CONNECT %[1]s HTTP/1.1\r\nHost: %[1]s\r\nProxy-Authorization: Basic %%s\r\n\r\n' "$auth" | nc -w 2 ${p%%:*} ${p##*:} | head -1`, target)
		return s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", script}})["stdout"].(string)
	}
	if got := connect(fmt.Sprintf("%s:%d", name, port)); !strings.Contains(got, "200") {
		t.Fatalf("allowed CONNECT: %q", got)
	}
	if got := connect("blocked.example:443"); !strings.Contains(got, "403") {
		t.Fatalf("refused CONNECT: %q", got)
	}
	sandbox := s.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})["sandbox"].(string)
	s.cs.Close()
	b, err := os.ReadFile(audit)
	if err != nil {
		t.Fatal(err)
	}
	var allow, deny map[string]any
	tools := 0
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		switch rec["kind"] {
		case "proxy_decision":
			if rec["decision"] == "allow" {
				allow = rec
			} else {
				deny = rec
			}
		case "tool_call":
			tools++
		}
	}
	if tools != 3 {
		t.Errorf("%d tool call records, want 3", tools)
	}
	if allow == nil || allow["sandbox"] != sandbox || allow["host"] != name || allow["port"] != float64(port) ||
		allow["addr"] == "" || len(allow["resolved"].([]any)) == 0 || !strings.Contains(allow["reason"].(string), "allowed") {
		t.Fatalf("allow record: %v", allow)
	}
	if deny == nil || deny["sandbox"] != sandbox || deny["host"] != "blocked.example" || deny["status"] != float64(403) ||
		!strings.Contains(deny["reason"].(string), "--allow-host") {
		t.Fatalf("deny record: %v", deny)
	}
}

// TestProxyRefusalFloodIsBounded: a sandbox that loops on refused CONNECTs
// gets each one answered, but the server's log and audit log grow by a
// bounded number of records whose counts add up to the refusals.
func TestProxyRefusalFloodIsBounded(t *testing.T) {
	name, _ := os.Hostname()
	audit := filepath.Join(t.TempDir(), "audit.jsonl")
	s := startServer(t, serverOpts{args: []string{"--network", "allowlist", "--allow-host", name + ":1", "--audit-log", audit}})
	const loops, each = 10, 30
	script := fmt.Sprintf(`p=${HTTPS_PROXY#http://}; auth=$(printf %%s "${p%%@*}" | base64); p=${p#*@}
for j in $(seq %d); do
  ( for i in $(seq %d); do
      printf "CONNECT blocked-$i.example:443 HTTP/1.1\r\nProxy-Authorization: Basic $auth\r\n\r\n" | nc -w 2 ${p%%:*} ${p##*:} | head -1 >>/tmp/answers.$j
    done ) &
done
wait; cat /tmp/answers.* | grep -c '^HTTP/1.1 4'`, loops, each)
	start := time.Now()
	out := s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", script}, "timeout_ms": 120000})
	answered := 0
	fmt.Sscan(strings.TrimSpace(out["stdout"].(string)), &answered)
	t.Logf("%d of %d refusals answered in %v", answered, loops*each, time.Since(start).Round(time.Millisecond))
	if answered < loops*each*9/10 {
		t.Fatalf("only %d of %d refused requests were answered: %v", answered, loops*each, out)
	}
	s.cs.Close() // the server exits: the open interval's summaries are written

	recs, counted, bytes := 0, 0, 0
	b, err := os.ReadFile(audit)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		if rec["kind"] == "proxy_decision" && rec["decision"] == "deny" {
			n, _ := rec["count"].(float64)
			recs, counted, bytes = recs+1, counted+int(n), bytes+len(line)+1
		}
	}
	t.Logf("%d refusal records in the audit log (%d bytes)", recs, bytes)
	// 16 kinds of refusal each interval, a summary for each, and one for
	// the rest; the flood may span two intervals.
	if recs > 2*(2*16+1) {
		t.Errorf("%d audit records for %d refusals", recs, answered)
	}
	if counted < answered || counted > loops*each {
		t.Errorf("the audit records count %d refusals; %d were answered, %d sent", counted, answered, loops*each)
	}
	if lines := strings.Count(s.stderr.String(), `msg="proxy decision"`); lines != recs {
		t.Errorf("%d proxy decision log lines, %d audit records", lines, recs)
	}
}
