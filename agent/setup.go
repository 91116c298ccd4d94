package agent

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// systemRoots are the files where Linux distributions keep their root
// certificates as one PEM bundle, in the order Go's crypto/x509 tries them.
var systemRoots = []string{
	"/etc/ssl/certs/ca-certificates.crt",                // Debian, Ubuntu, Alpine, Gentoo
	"/etc/pki/tls/certs/ca-bundle.crt",                  // Fedora, RHEL 6
	"/etc/ssl/ca-bundle.pem",                            // openSUSE
	"/etc/pki/tls/cacert.pem",                           // OpenELEC
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", // CentOS, RHEL 7
	"/etc/ssl/cert.pem",                                 // Alpine Linux
}

// Bounds of the setup request: the certificates sent, and the image's root
// file read (Debian's is about 220 KiB).
const (
	maxSetupCerts  = 64 << 10
	maxSystemRoots = 4 << 20
)

// setup writes the CA bundle: the image's roots, then the certificates the
// server sent. It checks that what it got is certificates only, never a
// key. The file and its directory end up read-only (0444 and 0555).
func (s *server) setup(req agentproto.SetupRequest) (agentproto.SetupResult, error) {
	if err := checkSetupEnv(req.Env); err != nil {
		return agentproto.SetupResult{}, err
	}
	res, err := writeBundle(req, agentproto.CABundlePath, systemRoots)
	if err != nil {
		return res, err
	}
	if len(req.Env) > 0 {
		s.envMu.Lock()
		s.env = append(slices.Clip(s.env), req.Env...)
		for _, kv := range req.Env {
			if v, ok := strings.CutPrefix(kv, "PATH="); ok {
				s.path = cleanSearchPath(filepath.SplitList(v), s.opts.Workspace)
			}
		}
		s.envMu.Unlock()
		res.Env = len(req.Env)
	}
	return res, nil
}

// checkSetupEnv checks a setup's variables: NAME=VALUE each, a name
// without NUL, and MaxSetupEnv bytes at most.
func checkSetupEnv(env []string) error {
	n := 0
	for _, kv := range env {
		n += len(kv)
		name, _, ok := strings.Cut(kv, "=")
		if !ok || name == "" || strings.ContainsRune(kv, 0) {
			return errcode.Errorf(errcode.InvalidArgument, "setup: env entry %q is not NAME=VALUE", truncateName(kv))
		}
	}
	if n > agentproto.MaxSetupEnv {
		return errcode.Errorf(errcode.InvalidArgument, "setup: %d bytes of environment, more than %d", n, agentproto.MaxSetupEnv)
	}
	return nil
}

// truncateName is the start of an env entry, for an error that must not
// carry its value.
func truncateName(kv string) string {
	name, _, _ := strings.Cut(kv, "=")
	if len(name) > 64 {
		name = name[:64]
	}
	return name
}

// baseEnv is the base environment of every command: the agent's own,
// then the setup's.
func (s *server) baseEnv() []string {
	s.envMu.RLock()
	defer s.envMu.RUnlock()
	return s.env
}

// searchPath is the program search path.
func (s *server) searchPath() []string {
	s.envMu.RLock()
	defer s.envMu.RUnlock()
	return s.path
}

// writeBundle is setup, writing to path with the first of roots that exists.
func writeBundle(req agentproto.SetupRequest, path string, roots []string) (agentproto.SetupResult, error) {
	var res agentproto.SetupResult
	if req.CACerts == "" {
		return res, nil
	}
	if len(req.CACerts) > maxSetupCerts {
		return res, errcode.Errorf(errcode.InvalidArgument, "setup: %d bytes of CA certificates, more than %d", len(req.CACerts), maxSetupCerts)
	}
	rest := []byte(req.CACerts)
	for n := 0; ; n++ {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			if n == 0 || strings.TrimSpace(string(rest)) != "" {
				return res, errcode.Errorf(errcode.InvalidArgument, "setup: ca_certs is not a list of PEM certificates")
			}
			break
		}
		if b.Type != "CERTIFICATE" {
			return res, errcode.Errorf(errcode.InvalidArgument, "setup: ca_certs holds a %q block; only certificates go into the sandbox", b.Type)
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return res, errcode.Errorf(errcode.InvalidArgument, "setup: ca_certs: %w", err)
		}
	}

	var bundle []byte
	for _, p := range roots {
		b, err := readBounded(p, maxSystemRoots)
		if err == nil && len(b) > 0 {
			bundle, res.SystemRoots = b, p
			break
		}
	}
	if len(bundle) > 0 && bundle[len(bundle)-1] != '\n' {
		bundle = append(bundle, '\n')
	}
	bundle = append(bundle, "# sandbox-mcp egress proxy CA: it signs the certificates of the hosts\n# whose requests the proxy adds credentials to.\n"...)
	bundle = append(bundle, req.CACerts...)

	dir := filepath.Dir(path)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return res, fmt.Errorf("setup: %w", err)
	}
	if st, err := os.Lstat(dir); err != nil || !st.IsDir() {
		return res, fmt.Errorf("setup: %s is not a directory", dir)
	}
	os.Chmod(dir, 0o755)
	tmp, err := os.CreateTemp(dir, ".bundle-*")
	if err != nil {
		return res, fmt.Errorf("setup: %w", err)
	}
	_, werr := tmp.Write(bundle)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr, os.Chmod(tmp.Name(), 0o444), os.Rename(tmp.Name(), path)); err != nil {
		os.Remove(tmp.Name())
		return res, fmt.Errorf("setup: write %s: %w", path, err)
	}
	if err := os.Chmod(dir, 0o555); err != nil {
		return res, fmt.Errorf("setup: %w", err)
	}
	res.CABundle = path
	return res, nil
}

// readBounded reads a regular file of at most max bytes.
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, max)
	}
	return b, nil
}
