package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/image"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// toolboxArgs give the toolbox tests room: a compiler, npm and a venv need
// more than the small defaults startServer sets.
var toolboxArgs = []string{"--memory", "1GiB", "--max-workspace-bytes", "256MiB", "--max-exec-timeout", "10m"}

// run runs command with bash -c in the sandbox with env, allowing it up to
// timeout, and returns the structured result. It fails the test if the call
// fails or the command exits non-zero, showing what it printed.
func (s *server) run(command string, env map[string]string, timeout time.Duration) map[string]any {
	s.t.Helper()
	args := map[string]any{"argv": []string{"bash", "-c", command}, "timeout_ms": timeout.Milliseconds()}
	if len(env) > 0 {
		args["env"] = env
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_exec", Arguments: args})
	if err != nil {
		s.t.Fatalf("exec %q: %v", command, err)
	}
	m, _ := res.StructuredContent.(map[string]any)
	if id, ok := m["sandbox"].(string); ok && id != "" {
		s.mu.Lock()
		s.sandboxes[id] = true
		s.mu.Unlock()
	}
	if !res.IsError {
		m = s.followRunning("sandbox_exec", args, m)
	}
	if res.IsError || m["exit_code"] != float64(0) {
		s.t.Fatalf("exec %q failed: %s\nstdout: %v\nstderr: %v", command, text(res), m["stdout"], m["stderr"])
	}
	return m
}

// TestToolboxImage runs each tool the default image promises in a real
// sandbox of it, through the built server and an MCP client, and checks the
// image's rules (the sandbox user, no setuid/setgid bit, HOME and the
// workspace).
func TestToolboxImage(t *testing.T) {
	s := startServer(t, serverOpts{image: testenv.DefaultImage(t), args: toolboxArgs})
	write := func(path, content string) {
		s.ok("sandbox_write_file", map[string]any{"path": path, "content": content})
	}
	expect := func(out map[string]any, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(out["stdout"].(string), w) {
				t.Errorf("stdout lacks %q:\n%s", w, out["stdout"])
			}
		}
	}

	// The image's rules. find -xdev stays on the image's root filesystem.
	out := s.run(`id; echo "home=$HOME pwd=$(pwd)"; find / -xdev -perm /6000 -printf 'SETID %p\n'; echo scanned`, nil, 2*time.Minute)
	expect(out, "uid=1000(sandbox) gid=1000(sandbox)", "home=/tmp pwd=/workspace", "scanned")
	if strings.Contains(out["stdout"].(string), "SETID") {
		t.Errorf("setuid/setgid files in the image:\n%s", out["stdout"])
	}

	// C, C++ and make.
	write("hello.c", "#include <stdio.h>\nint main(void) { printf(\"c says %d\\n\", 6 * 7); return 0; }\n")
	write("hello.cpp", "#include <iostream>\n#include <numeric>\n#include <vector>\n"+
		"int main() { std::vector<int> v{1, 2, 3, 4}; std::cout << \"c++ says \" << std::accumulate(v.begin(), v.end(), 0) << std::endl; }\n")
	write("Makefile", "hello-made: hello.c\n\tcc -O2 -Wall -o $@ hello.c\n")
	out = s.run(`gcc -Wall -o hello-c hello.c && ./hello-c && g++ -std=c++17 -Wall -o hello-cpp hello.cpp && ./hello-cpp && make && ./hello-made && make`, nil, 5*time.Minute)
	expect(out, "c says 42", "c++ says 10", "cc -O2 -Wall -o hello-made hello.c", "'hello-made' is up to date")

	// Python: a venv with its own pip.
	out = s.run(`python3 -m venv venv && venv/bin/pip --version && venv/bin/python -c 'import sys; print("prefix", sys.prefix)'`, nil, 5*time.Minute)
	expect(out, "pip 2", "from /workspace/venv/", "prefix /workspace/venv")

	// Node.js and npm.
	out = s.run(`node -e 'console.log("node says", [1, 2, 3].map(x => x * 2).join(","))' && npm --version`, nil, 2*time.Minute)
	expect(out, "node says 2,4,6")
	if !regexp.MustCompile(`(?m)^\d+\.\d+\.\d+$`).MatchString(out["stdout"].(string)) {
		t.Errorf("npm --version printed no version:\n%s", out["stdout"])
	}

	// The text tools.
	write("data.json", `{"items": [{"name": "a", "n": 1}, {"name": "b", "n": 2}]}`)
	write("notes/todo.txt", "first line\nthe needle is here\nlast line\n")
	write("greeting.txt", "hello\nworld\n")
	write("greeting.patch", "--- greeting.txt\n+++ greeting.txt\n@@ -1,2 +1,2 @@\n hello\n-world\n+sandbox\n")
	out = s.run(`set -eo pipefail
jq -c '[.items[] | .n * 10]' data.json
rg -n needle notes
patch -p0 < greeting.patch
cat greeting.txt
printf 'AB\n' | xxd -p
echo 4142 | xxd -r -p; echo
file hello-c data.json
zip -q -r bundle.zip notes data.json
rm -r notes data.json
unzip -q bundle.zip
wc -l < notes/todo.txt
unzip -l bundle.zip | tail -n 1
printf 'b,2\na,1\n' | sort | awk -F, '{ s += $2 } END { print "awk sum", s }'
echo "sed: $(echo grey | sed 's/e/a/')"
echo abc | grep -c b
find notes -name '*.txt'
diff <(printf 'x\ny\n') <(printf 'x\nz\n') || echo "diff found a change"
tar czf notes.tgz notes
gzip -t notes.tgz
tar tzf notes.tgz
curl --version | head -n 1
less --version | head -n 1
ps -e -o comm= | grep -x bash`, nil, 2*time.Minute)
	expect(out, "[10,20]", "notes/todo.txt:2:the needle is here", "hello\nsandbox\n", "41420a\n", "AB\n",
		"ELF 64-bit LSB pie executable", "data.json: JSON", "3\n", "3 files", "awk sum 3", "sed: gray", "notes/todo.txt",
		"diff found a change", "notes/\nnotes/todo.txt\n", "curl ", "less ", "\nbash\n")

	// git: a repository with a commit and a diff.
	out = s.run(`set -e
git init -q repo
cd repo
git config user.email agent@example.com
git config user.name agent
echo one > f
git add f
git commit -q -m first
echo two >> f
git diff --stat
git commit -q -am second
git log --format=%s`, nil, 2*time.Minute)
	expect(out, "1 file changed, 1 insertion(+)", "second\nfirst\n")
}

// packageIndex is a package index served over HTTPS on this host, for pip
// (a PEP 503 "simple" index with one wheel) and for npm (a registry document
// and its tarball), under a name that resolves to this host. It records the
// requests it serves.
type packageIndex struct {
	host  string // host:port, the name the sandbox uses
	caPEM string
	token string // the value the packages print, unique to this index

	mu       sync.Mutex
	requests []string
	auth     []string // the Authorization header of each request, "" if none
}

// sawAuth reports whether some request carried this Authorization header.
func (ix *packageIndex) sawAuth(auth string) bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return slices.Contains(ix.auth, auth)
}

func (ix *packageIndex) saw(prefix string) bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, r := range ix.requests {
		if strings.HasPrefix(r, prefix) {
			return true
		}
	}
	return false
}

func (ix *packageIndex) log() string {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return strings.Join(ix.requests, "\n")
}

func startPackageIndex(t *testing.T) *packageIndex {
	t.Helper()
	name, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox's NO_PROXY exempts localhost: the index needs a name that
	// the proxy resolves to an address of this host.
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
	ln, err := net.Listen("tcp", net.JoinHostPort(addrs[0].String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	nonce := make([]byte, 8)
	rand.Read(nonce)
	ix := &packageIndex{
		host:  fmt.Sprintf("%s:%d", name, ln.Addr().(*net.TCPAddr).Port),
		caPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		token: "probe-" + hex.EncodeToString(nonce),
	}

	wheelName := "sandbox_mcp_probe-1.0-py3-none-any.whl"
	wheel := buildWheel(t, ix.token)
	wheelSum := sha256.Sum256(wheel)
	tgz := buildNpmTarball(t, ix.token)
	sha1Sum := sha1.Sum(tgz)
	sha512Sum := sha512.Sum512(tgz)
	tarballURL := "https://" + ix.host + "/npm/sandbox-mcp-probe/-/sandbox-mcp-probe-1.0.0.tgz"
	packument, err := json.Marshal(map[string]any{
		"name":      "sandbox-mcp-probe",
		"dist-tags": map[string]string{"latest": "1.0.0"},
		"versions": map[string]any{"1.0.0": map[string]any{
			"name": "sandbox-mcp-probe", "version": "1.0.0",
			"bin": map[string]string{"sandbox-mcp-probe": "cli.js"},
			"dist": map[string]string{
				"tarball":   tarballURL,
				"shasum":    hex.EncodeToString(sha1Sum[:]),
				"integrity": "sha512-" + base64.StdEncoding.EncodeToString(sha512Sum[:]),
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /simple/sandbox-mcp-probe/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, "<!DOCTYPE html><html><body><a href=\"/files/%s#sha256=%s\">%s</a></body></html>\n",
			wheelName, hex.EncodeToString(wheelSum[:]), wheelName)
	})
	mux.HandleFunc("GET /files/"+wheelName, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(wheel)
	})
	mux.HandleFunc("GET /npm/sandbox-mcp-probe", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(packument)
	})
	mux.HandleFunc("GET /npm/sandbox-mcp-probe/-/sandbox-mcp-probe-1.0.0.tgz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(tgz)
	})
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ix.mu.Lock()
			ix.requests = append(ix.requests, r.Method+" "+r.URL.Path)
			ix.auth = append(ix.auth, r.Header.Get("Authorization"))
			ix.mu.Unlock()
			mux.ServeHTTP(w, r)
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return ix
}

// buildWheel makes a pure-Python wheel of sandbox-mcp-probe 1.0 whose module
// holds VALUE = token.
func buildWheel(t *testing.T, token string) []byte {
	t.Helper()
	files := []struct{ name, body string }{
		{"sandbox_mcp_probe/__init__.py", fmt.Sprintf("VALUE = %q\n", token)},
		{"sandbox_mcp_probe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: sandbox-mcp-probe\nVersion: 1.0\nSummary: a package served by a sandbox-mcp test\n"},
		{"sandbox_mcp_probe-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: sandbox-mcp-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f.body))
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString("sandbox_mcp_probe-1.0.dist-info/RECORD,,\n")
	w, err := zw.Create("sandbox_mcp_probe-1.0.dist-info/RECORD")
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte(record.String()))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// buildNpmTarball makes the tarball of npm package sandbox-mcp-probe 1.0.0,
// which exports token and has a command that prints it.
func buildNpmTarball(t *testing.T, token string) []byte {
	t.Helper()
	files := []struct {
		name, body string
		mode       int64
	}{
		{"package/package.json", `{"name": "sandbox-mcp-probe", "version": "1.0.0", "main": "index.js", "bin": {"sandbox-mcp-probe": "cli.js"}}`, 0o644},
		{"package/index.js", fmt.Sprintf("module.exports = %q;\n", token), 0o644},
		{"package/cli.js", "#!/usr/bin/env node\nconsole.log('cli says ' + require('./index.js'));\n", 0o755},
	}
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.body)), Typeflag: tar.TypeReg, ModTime: time.Unix(1700000000, 0)}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(f.body))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// proxyDecisions counts the server's allowed proxy decisions for host:port.
func proxyDecisions(log, hostPort string) int {
	host, port, _ := net.SplitHostPort(hostPort)
	n := 0
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `msg="proxy decision"`) && strings.Contains(line, " host="+host+" ") &&
			strings.Contains(line, " port="+port+" ") && strings.Contains(line, " allow=true ") {
			n++
		}
	}
	return n
}

// TestToolboxPackageManagersThroughProxy: with the index's host on
// --allow-host, pip (in a venv and as a plain user install) and npm (local
// and -g) in a sandbox of the default image fetch packages from it through
// the egress proxy: the index serves the requests, the proxy logs its
// decisions, and the installed packages run.
func TestToolboxPackageManagersThroughProxy(t *testing.T) {
	ix := startPackageIndex(t)
	s := startServer(t, serverOpts{image: testenv.DefaultImage(t), args: append([]string{
		"--network", "allowlist", "--allow-host", ix.host, "--allow-private-networks"}, toolboxArgs...)})
	s.ok("sandbox_write_file", map[string]any{"path": "ca.pem", "content": ix.caPEM})
	check := func(step string, out map[string]any, requests ...string) {
		t.Helper()
		if !strings.Contains(out["stdout"].(string), ix.token) {
			t.Errorf("%s: the installed package did not print %s:\n%s\n%s", step, ix.token, out["stdout"], out["stderr"])
		}
		for _, r := range requests {
			if !ix.saw(r) {
				t.Errorf("%s: the index did not see %q; it saw:\n%s", step, r, ix.log())
			}
		}
	}

	pipEnv := map[string]string{"PIP_INDEX_URL": "https://" + ix.host + "/simple/", "PIP_CERT": "/workspace/ca.pem"}
	out := s.run(`python3 -m venv venv && venv/bin/pip install sandbox-mcp-probe && venv/bin/python -c 'import sandbox_mcp_probe as p; print(p.VALUE)'`, pipEnv, 5*time.Minute)
	check("pip install in a venv", out, "GET /simple/sandbox-mcp-probe/", "GET /files/sandbox_mcp_probe-1.0-py3-none-any.whl")
	afterPip := proxyDecisions(s.stderr.String(), ix.host)
	if afterPip == 0 {
		t.Errorf("pip: no allowed proxy decision for %s in the server's log:\n%s", ix.host, s.stderr)
	}
	// Outside a venv, pip installs for the user (the root filesystem is
	// read-only), into $HOME/.local.
	out = s.run(`pip install sandbox-mcp-probe && python3 -c 'import sandbox_mcp_probe as p; print(p.__file__, p.VALUE)'`, pipEnv, 5*time.Minute)
	check("pip install for the user", out)
	if !strings.Contains(out["stdout"].(string), "/tmp/.local/lib/python3") {
		t.Errorf("pip did not install into $HOME/.local:\n%s", out["stdout"])
	}

	npmEnv := map[string]string{"NPM_CONFIG_REGISTRY": "https://" + ix.host + "/npm/", "NODE_EXTRA_CA_CERTS": "/workspace/ca.pem"}
	out = s.run(`mkdir app && cd app && npm install --no-audit --no-fund sandbox-mcp-probe && node -e 'console.log(require("sandbox-mcp-probe"))'`, npmEnv, 5*time.Minute)
	check("npm install", out, "GET /npm/sandbox-mcp-probe", "GET /npm/sandbox-mcp-probe/-/sandbox-mcp-probe-1.0.0.tgz")
	// npm's global prefix is under $HOME, and its bin directory is on PATH.
	out = s.run(`npm install -g --no-audit --no-fund sandbox-mcp-probe && command -v sandbox-mcp-probe && sandbox-mcp-probe`, npmEnv, 5*time.Minute)
	check("npm install -g", out)
	if !strings.Contains(out["stdout"].(string), "/tmp/.local/bin/sandbox-mcp-probe\ncli says "+ix.token) {
		t.Errorf("npm -g: the command is not on PATH:\n%s", out["stdout"])
	}
	if n := proxyDecisions(s.stderr.String(), ix.host); n <= afterPip {
		t.Errorf("npm: no allowed proxy decision for %s in the server's log after pip's %d", ix.host, afterPip)
	}
}

// TestToolchainImage builds examples/toolchain/Dockerfile FROM the tag that
// `sandbox-mcp image` prints, offline, and runs a sandbox on the result with
// --image: the tool it adds runs as the sandbox user.
func TestToolchainImage(t *testing.T) {
	testenv.NeedsDocker(t) // skips under -short before the build
	out, err := exec.Command(bins.Get(t).Server, "image").Output()
	if err != nil {
		t.Fatalf("sandbox-mcp image: %v", err)
	}
	base := strings.TrimSpace(string(out))
	if base != image.DefaultTag() || base != testenv.DefaultImage(t) {
		t.Fatalf("sandbox-mcp image printed %q, want the default image %s", out, image.DefaultTag())
	}

	suffix := make([]byte, 6)
	rand.Read(suffix)
	tag := "sandbox-mcp-e2e-toolchain:" + hex.EncodeToString(suffix)
	cli := testenv.Engine(t)
	t.Cleanup(func() { removeDerivedImage(t, cli, tag) })
	build := exec.Command("docker", "build", "--pull=false", "--network=none", "--build-arg", "BASE="+base, "-t", tag,
		filepath.Join(testenv.RepoRoot(), "examples", "toolchain"))
	if log, err := build.CombinedOutput(); err != nil {
		t.Fatalf("docker build examples/toolchain: %v\n%s", err, log)
	}

	s := startServer(t, serverOpts{image: tag})
	res := s.run("toolchain-check", nil, 2*time.Minute)
	for _, want := range []string{"toolchain-check: running as 1000:1000 in /workspace", "gcc (Debian", "Python 3.", "node v"} {
		if !strings.Contains(res["stdout"].(string), want) {
			t.Errorf("toolchain-check output lacks %q:\n%s", want, res["stdout"])
		}
	}
}

// removeDerivedImage removes the image tag, the runtime images the server
// built from it and the untagged images below them (the build steps), and
// fails the test if the image is still on the engine afterwards.
func removeDerivedImage(t *testing.T, cli *client.Client, tag string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	info, err := cli.ImageInspect(ctx, tag)
	if err != nil {
		t.Errorf("inspect %s: %v", tag, err)
		return
	}
	list, err := cli.ImageList(ctx, client.ImageListOptions{Filters: make(client.Filters).Add("label", docker.LabelRuntime+".base="+tag)})
	if err != nil {
		t.Errorf("list runtime images of %s: %v", tag, err)
	}
	for _, img := range list.Items {
		if _, err := cli.ImageRemove(ctx, img.ID, client.ImageRemoveOptions{Force: true, PruneChildren: true}); err != nil {
			t.Errorf("remove runtime image %s of %s: %v", img.ID, tag, err)
		}
	}
	if _, err := cli.ImageRemove(ctx, tag, client.ImageRemoveOptions{PruneChildren: true}); err != nil {
		t.Errorf("remove %s: %v", tag, err)
	}
	// The engine lets go of an image once the last container made from it
	// is gone; the server's removals may still be finishing.
	for {
		if _, err := cli.ImageInspect(ctx, info.ID); err != nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Errorf("image %s (%s) is still on the engine after its removal", info.ID, tag)
			return
		case <-time.After(200 * time.Millisecond):
			_, _ = cli.ImageRemove(ctx, info.ID, client.ImageRemoveOptions{PruneChildren: true})
		}
	}
}
