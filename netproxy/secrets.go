package netproxy

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Secret is a credential the proxy puts into requests to its hosts, so that
// the sandbox never holds it. The sandbox gets Name set to a placeholder
// ([Proxy.SecretEnv]); in a request to one of Hosts, the proxy replaces that
// placeholder by Value in the request line and headers.
type Secret struct {
	// Name is the environment variable the sandbox sees, such as
	// "GITHUB_TOKEN".
	Name string
	// Value is the real credential. It is never logged, never sent to the
	// sandbox and never put into an error.
	Value string
	// Hosts are the exact host names (no wildcards, no ports) whose
	// requests get Value. Each must be on the allowlist.
	Hosts []string
}

// MaxSecretBytes bounds a secret's value: it goes into HTTP headers, whose
// size a server limits (often to 8 KiB in all).
const MaxSecretBytes = 4 << 10

// placeholderPrefix starts every placeholder, so that one is recognisable
// in a log or a bug report for what it is.
const placeholderPrefix = "sbx-secret-"

var secretName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ParseSecretSpec parses "NAME@HOST[,HOST...]", the form of --secret, into
// a name and normalised host names.
func ParseSecretSpec(spec string) (name string, hosts []string, err error) {
	name, list, ok := strings.Cut(spec, "@")
	if !ok || name == "" || list == "" {
		return "", nil, fmt.Errorf("%q is not NAME@HOST[,HOST...]; write e.g. GITHUB_TOKEN@github.com,api.github.com", truncate(spec, 100))
	}
	if !secretName.MatchString(name) {
		return "", nil, fmt.Errorf("%q is not a valid variable name: use letters, digits and _ and start with a letter or _", truncate(name, 100))
	}
	for _, h := range strings.Split(list, ",") {
		h = strings.TrimSpace(h)
		if strings.HasPrefix(h, "*.") {
			return "", nil, fmt.Errorf("secret %s: host %q is a wildcard; name each host the secret is for (a secret goes to exact names only)", name, truncate(h, 100))
		}
		if strings.ContainsAny(h, ":/") {
			return "", nil, fmt.Errorf("secret %s: host %q has a port or a path; give the bare host name (the port comes from --allow-host)", name, truncate(h, 100))
		}
		norm, kind, problem := normalizeHost(h)
		switch {
		case kind == hostIP:
			return "", nil, fmt.Errorf("secret %s: host %q is an IP address; the proxy tunnels to names only, give the host's name", name, h)
		case problem != "":
			return "", nil, fmt.Errorf("secret %s: host %q: %s", name, truncate(h, 100), problem)
		}
		if !slices.Contains(hosts, norm) {
			hosts = append(hosts, norm)
		}
	}
	return name, hosts, nil
}

// checkSecretValue says what is wrong with a secret's value, or "".
func checkSecretValue(v string) string {
	switch {
	case v == "":
		return "its value is empty"
	case len(v) > MaxSecretBytes:
		return fmt.Sprintf("its value is longer than %d bytes", MaxSecretBytes)
	case strings.ContainsAny(v, "\r\n\x00"):
		return "its value holds a line break or NUL, which cannot go into an HTTP header"
	case strings.HasPrefix(v, placeholderPrefix):
		return "its value looks like a placeholder (" + placeholderPrefix + "...)"
	}
	return ""
}

// secretSet holds the checked secrets and the key that derives each
// sandbox's placeholders.
type secretSet struct {
	key     [32]byte
	secrets []Secret
	byHost  map[string][]int // host -> indexes into secrets
}

func newSecretSet(secrets []Secret, allow *Allowlist) (*secretSet, error) {
	s := &secretSet{byHost: map[string][]int{}}
	if _, err := rand.Read(s.key[:]); err != nil {
		return nil, fmt.Errorf("netproxy: placeholder key: %w", err)
	}
	var errs []error
	seen := map[string]bool{}
	for _, sec := range secrets {
		if !secretName.MatchString(sec.Name) {
			errs = append(errs, fmt.Errorf("secret %q: not a valid variable name", truncate(sec.Name, 100)))
			continue
		}
		if seen[sec.Name] {
			errs = append(errs, fmt.Errorf("secret %s is given twice; give it once with all its hosts", sec.Name))
			continue
		}
		seen[sec.Name] = true
		if why := checkSecretValue(sec.Value); why != "" {
			errs = append(errs, fmt.Errorf("secret %s: %s", sec.Name, why))
			continue
		}
		if len(sec.Hosts) == 0 {
			errs = append(errs, fmt.Errorf("secret %s names no host", sec.Name))
			continue
		}
		c := Secret{Name: sec.Name, Value: sec.Value}
		for _, h := range sec.Hosts {
			norm, kind, problem := normalizeHost(h)
			if kind != hostName || problem != "" || strings.HasPrefix(norm, "*.") {
				errs = append(errs, fmt.Errorf("secret %s: %q is not a host name", sec.Name, truncate(h, 100)))
				continue
			}
			if len(allow.ports(norm)) == 0 {
				errs = append(errs, fmt.Errorf("secret %s is for %s, which is not on the --allow-host list: the proxy only reaches allowed hosts, so add --allow-host %s", sec.Name, norm, norm))
				continue
			}
			if !slices.Contains(c.Hosts, norm) {
				c.Hosts = append(c.Hosts, norm)
				s.byHost[norm] = append(s.byHost[norm], len(s.secrets))
			}
		}
		s.secrets = append(s.secrets, c)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

var placeholderEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// placeholder is the value the sandbox sees for a secret: the name and 130
// bits derived from a key made at start, the sandbox and the name. It is
// stable for a sandbox (its restarts see the same value), differs between
// sandboxes and between server starts, and says nothing about the real
// value.
func (s *secretSet) placeholder(sandbox, name string) string {
	m := hmac.New(sha256.New, s.key[:])
	m.Write([]byte(sandbox))
	m.Write([]byte{0})
	m.Write([]byte(name))
	return placeholderPrefix + name + "-" + placeholderEncoding.EncodeToString(m.Sum(nil)[:17])[:26]
}

// intercepts reports whether tunnels to the normalised host are
// intercepted: some secret is for it.
func (s *secretSet) intercepts(host string) bool {
	return s != nil && len(s.byHost[host]) > 0
}

// rewriter replaces one sandbox's placeholders for one host.
type rewriter struct {
	names        []string
	placeholders []string
	values       []string
}

// rewriter returns the replacements for requests from sandbox to host.
func (s *secretSet) rewriter(sandbox, host string) *rewriter {
	rw := &rewriter{}
	for _, i := range s.byHost[host] {
		sec := s.secrets[i]
		rw.names = append(rw.names, sec.Name)
		rw.placeholders = append(rw.placeholders, s.placeholder(sandbox, sec.Name))
		rw.values = append(rw.values, sec.Value)
	}
	return rw
}

// replace returns v with every placeholder replaced by its value, and sets
// used[i] for each secret i replaced.
func (rw *rewriter) replace(v string, used []bool) string {
	if !strings.Contains(v, placeholderPrefix) {
		return v
	}
	for i, ph := range rw.placeholders {
		if strings.Contains(v, ph) {
			v = strings.ReplaceAll(v, ph, rw.values[i])
			used[i] = true
		}
	}
	return v
}

// replaceHeader is replace for a header value. For "Basic" credentials
// (Authorization, Proxy-Authorization) the user:password pair is decoded,
// replaced and encoded again.
func (rw *rewriter) replaceHeader(key, v string, used []bool) string {
	if key == "Authorization" || key == "Proxy-Authorization" {
		if scheme, cred, ok := strings.Cut(v, " "); ok && strings.EqualFold(scheme, "Basic") {
			cred = strings.TrimSpace(cred)
			if raw, err := base64.StdEncoding.DecodeString(cred); err == nil {
				if r := rw.replace(string(raw), used); r != string(raw) {
					return scheme + " " + base64.StdEncoding.EncodeToString([]byte(r))
				}
			}
		}
	}
	return rw.replace(v, used)
}

// restore is the reverse for what goes back to the sandbox: every real
// value in v becomes the sandbox's placeholder again. The proxy applies it
// to response headers (a redirect that carries the token in its URL);
// bodies are not rewritten.
func (rw *rewriter) restore(v string) string {
	for i, val := range rw.values {
		if strings.Contains(v, val) {
			v = strings.ReplaceAll(v, val, rw.placeholders[i])
		}
	}
	return v
}

// scrub replaces every secret's value in s by "[secret NAME]". Text that
// may quote a request (an upstream's error) passes through it before it is
// logged or sent back.
func (s *secretSet) scrub(v string) string {
	if s == nil {
		return v
	}
	for _, sec := range s.secrets {
		if strings.Contains(v, sec.Value) {
			v = strings.ReplaceAll(v, sec.Value, "[secret "+sec.Name+"]")
		}
	}
	return v
}

// CACert returns the interception CA's certificate in PEM, for the sandbox
// to trust, or nil if the proxy has no secrets. The CA's key never leaves
// the proxy.
func (p *Proxy) CACert() []byte {
	if p.ca == nil {
		return nil
	}
	return slices.Clone(p.ca.certPEM)
}

// SecretEnv returns "NAME=placeholder" for every secret, as the sandbox
// with this id sees them. A placeholder is worthless outside this proxy:
// it is replaced only in requests from that sandbox to the secret's hosts.
func (p *Proxy) SecretEnv(sandbox string) []string {
	if p.secrets == nil {
		return nil
	}
	env := make([]string, len(p.secrets.secrets))
	for i, s := range p.secrets.secrets {
		env[i] = s.Name + "=" + p.secrets.placeholder(sandbox, s.Name)
	}
	return env
}

// CheckSecrets reports what New would refuse in secrets given allow: an
// invalid name or value, a name given twice, a host allow does not list.
// No message quotes a value.
func CheckSecrets(secrets []Secret, allow *Allowlist) error {
	_, err := newSecretSet(secrets, allow)
	return err
}
