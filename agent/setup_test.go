package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

func testCertPEM(t *testing.T) string {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// TestWriteBundle: the bundle is the image's roots then the server's CA,
// read-only, in a read-only directory; anything but certificates is refused.
func TestWriteBundle(t *testing.T) {
	dir := t.TempDir()
	roots := filepath.Join(dir, "roots.pem")
	os.WriteFile(roots, []byte("ROOTS"), 0o644)
	path := filepath.Join(dir, "sub", "ca-bundle.pem")
	ca := testCertPEM(t)
	res, err := writeBundle(agentproto.SetupRequest{CACerts: ca}, path, []string{filepath.Join(dir, "missing"), roots})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Dir(path), 0o755) })
	b, _ := os.ReadFile(path)
	if res.CABundle != path || res.SystemRoots != roots || !strings.HasPrefix(string(b), "ROOTS\n") || !strings.HasSuffix(string(b), ca) {
		t.Errorf("result %+v, bundle %q", res, b)
	}
	st, _ := os.Stat(path)
	dst, _ := os.Stat(filepath.Dir(path))
	if st.Mode().Perm() != 0o444 || dst.Mode().Perm() != 0o555 {
		t.Errorf("modes %v %v, want 0444 and 0555", st.Mode(), dst.Mode())
	}

	key := "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----\n"
	for name, certs := range map[string]string{"a key": ca + key, "not PEM": "hello", "garbage after": ca + "junk"} {
		if _, err := writeBundle(agentproto.SetupRequest{CACerts: certs}, filepath.Join(dir, "other", "b.pem"), nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if res, err := writeBundle(agentproto.SetupRequest{}, filepath.Join(dir, "none", "b.pem"), nil); err != nil || res.CABundle != "" {
		t.Errorf("no certificates: %+v %v", res, err)
	}
}

// TestSetupEnv: a setup's variables join the base environment of every
// command after the agent's own (so they override it), a PATH among them
// becomes the search path, and a malformed or oversized list is refused
// without echoing a value.
func TestSetupEnv(t *testing.T) {
	ws := t.TempDir()
	s := &server{opts: Options{Workspace: ws}, env: []string{"PATH=/bin", "A=1"}, path: []string{"/bin"}}
	res, err := s.setup(agentproto.SetupRequest{Env: []string{"A=2", "PATH=/usr/local/bin:relative:" + ws + "/bin", "TOKEN=s3cret"}})
	if err != nil || res.Env != 3 {
		t.Fatalf("setup: %+v %v", res, err)
	}
	if got := strings.Join(s.baseEnv(), " "); got != "PATH=/bin A=1 A=2 PATH=/usr/local/bin:relative:"+ws+"/bin TOKEN=s3cret" {
		t.Errorf("base env %q", got)
	}
	if got := strings.Join(s.searchPath(), ":"); got != "/usr/local/bin" {
		t.Errorf("search path %q", got)
	}
	for _, bad := range [][]string{{"=x"}, {"NOEQUALS"}, {"A=b\x00c"}, {"BIG=" + strings.Repeat("x", agentproto.MaxSetupEnv)}} {
		if _, err := s.setup(agentproto.SetupRequest{Env: bad}); err == nil || strings.Contains(err.Error(), "xxxx") || strings.Contains(err.Error(), "b\x00c") {
			t.Errorf("setup %.20q: %v", bad, err)
		}
	}
}
