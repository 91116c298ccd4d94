package netproxy

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
)

// Secret is a credential the proxy puts into requests to its hosts, so that
// the sandbox never holds it. The sandbox gets Name set to a placeholder
// ([Proxy.SecretEnv]); in a request to one of Hosts, the proxy replaces that
// placeholder by Value where a credential belongs: the Authorization
// header (inside Basic credentials too) and the headers in Headers; in the
// path and query only with InURL. Everything the host sends back has Value,
// in its common encodings, turned back into the placeholder.
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
	// Headers are further request header fields, besides Authorization,
	// whose placeholder is replaced (such as "X-Api-Key"). Names that
	// frame or route a request (Host, Content-Length, hop-by-hop fields)
	// are refused.
	Headers []string
	// InURL replaces the placeholder in the request's path and query too.
	// A host that quotes its URLs back (redirects, error pages, logs it
	// shows) then holds the value in more places; see docs/secrets.md.
	InURL bool
}

// MaxSecretBytes bounds a secret's value: it goes into HTTP headers, whose
// size a server limits (often to 8 KiB in all).
const MaxSecretBytes = 4 << 10

// MinSecretBytes is the shortest value a secret may have: the proxy turns
// the value back into the placeholder wherever it appears in what a host
// answers, and a shorter value would match ordinary text.
const MinSecretBytes = 8

// placeholderPrefix starts every placeholder, so that one is recognisable
// in a log or a bug report for what it is.
const placeholderPrefix = "sbx-secret-"

var secretName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// SecretSpecForm is the form of a --secret value, for messages.
const SecretSpecForm = "NAME@HOST[,HOST...][:header=FIELD][:url]"

// ParseSecretSpec parses NAME@HOST[,HOST...][:OPTION...], the form of
// --secret, into a Secret without its Value: a name, normalised host names
// and the options. An option is "header=FIELD" (the placeholder is
// replaced in that request header field too, besides Authorization;
// repeatable) or "url" (in the request's path and query too).
func ParseSecretSpec(spec string) (Secret, error) {
	name, rest, ok := strings.Cut(spec, "@")
	list, opts, _ := strings.Cut(rest, ":")
	if !ok || name == "" || list == "" {
		return Secret{}, fmt.Errorf("%q is not %s; write e.g. GITHUB_TOKEN@github.com,api.github.com", truncate(spec, 100), SecretSpecForm)
	}
	if !secretName.MatchString(name) {
		return Secret{}, fmt.Errorf("%q is not a valid variable name: use letters, digits and _ and start with a letter or _", truncate(name, 100))
	}
	sec := Secret{Name: name}
	for _, h := range strings.Split(list, ",") {
		h = strings.TrimSpace(h)
		if strings.HasPrefix(h, "*.") {
			return Secret{}, fmt.Errorf("secret %s: host %q is a wildcard; name each host the secret is for (a secret goes to exact names only)", name, truncate(h, 100))
		}
		if strings.Contains(h, "/") {
			return Secret{}, fmt.Errorf("secret %s: host %q has a path; give the bare host name", name, truncate(h, 100))
		}
		norm, kind, problem := normalizeHost(h)
		switch {
		case kind == hostIP:
			return Secret{}, fmt.Errorf("secret %s: host %q is an IP address; the proxy tunnels to names only, give the host's name", name, h)
		case problem != "":
			return Secret{}, fmt.Errorf("secret %s: host %q: %s", name, truncate(h, 100), problem)
		}
		if !slices.Contains(sec.Hosts, norm) {
			sec.Hosts = append(sec.Hosts, norm)
		}
	}
	if opts == "" && strings.Contains(rest, ":") {
		return Secret{}, fmt.Errorf("secret %s: an empty option after ':'; the options are header=FIELD and url", name)
	}
	for _, o := range strings.Split(opts, ":") {
		o = strings.TrimSpace(o)
		switch field, isHeader := strings.CutPrefix(o, "header="); {
		case opts == "":
		case o == "url":
			sec.InURL = true
		case isHeader:
			canon, why := checkSecretHeader(field)
			if why != "" {
				return Secret{}, fmt.Errorf("secret %s: header %q %s", name, truncate(field, 100), why)
			}
			if canon != "Authorization" && !slices.Contains(sec.Headers, canon) {
				sec.Headers = append(sec.Headers, canon)
			}
		default:
			return Secret{}, fmt.Errorf("secret %s: unknown option %q; the options are header=FIELD (the placeholder is replaced in that request header too) and url (in the path and query too), as in %s; a host takes no port here (the port comes from --allow-host)",
				name, truncate(o, 100), SecretSpecForm)
		}
	}
	return sec, nil
}

// routingHeaders are request header fields a secret may not go into: they
// frame or route the request, or never reach the host (hop-by-hop).
var routingHeaders = []string{"Host", "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive",
	"Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Upgrade", "Expect", "Range", "If-Range", "Accept-Encoding"}

// checkSecretHeader returns the canonical form of a header field name a
// secret may go into, or says what is wrong with it.
func checkSecretHeader(field string) (canon, why string) {
	if field == "" {
		return "", "is empty"
	}
	for i := 0; i < len(field); i++ {
		if c := field[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return "", "is not a header field name"
		}
	}
	canon = http.CanonicalHeaderKey(field)
	if slices.Contains(routingHeaders, canon) {
		return "", "frames or routes the request, or never reaches the host; a secret cannot go there"
	}
	return canon, ""
}

// checkSecretValue says what is wrong with a secret's value, or "".
func checkSecretValue(v string) string {
	switch {
	case v == "":
		return "its value is empty"
	case len(v) > MaxSecretBytes:
		return fmt.Sprintf("its value is longer than %d bytes", MaxSecretBytes)
	case len(v) < MinSecretBytes:
		return fmt.Sprintf("its value is shorter than %d bytes: the proxy turns the value back into the placeholder in everything the host answers, and a value that short would match ordinary text", MinSecretBytes)
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
	byHost  map[string][]int       // host -> indexes into secrets
	scrubs  map[string]*scrubIndex // host -> its secrets' values, to scrub responses of
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
		c := Secret{Name: sec.Name, Value: sec.Value, InURL: sec.InURL}
		for _, f := range sec.Headers {
			canon, why := checkSecretHeader(f)
			if why != "" {
				errs = append(errs, fmt.Errorf("secret %s: header %q %s", sec.Name, truncate(f, 100), why))
				continue
			}
			if canon != "Authorization" && !slices.Contains(c.Headers, canon) {
				c.Headers = append(c.Headers, canon)
			}
		}
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
	forms := make([][]form, len(s.secrets))
	for i, sec := range s.secrets {
		forms[i] = valueForms(sec.Value)
	}
	s.scrubs = map[string]*scrubIndex{}
	for host, idx := range s.byHost {
		var values []string
		var fs [][]form
		for _, i := range idx {
			values = append(values, s.secrets[i].Value)
			fs = append(fs, forms[i])
		}
		s.scrubs[host] = newScrubIndex(values, fs)
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
// intercepted: some secret is for it, and, unless held is nil (every
// secret), held has it.
func (s *secretSet) intercepts(host string, held map[string]bool) bool {
	if s == nil {
		return false
	}
	for _, i := range s.byHost[host] {
		if held == nil || held[s.secrets[i].Name] {
			return true
		}
	}
	return false
}

// rewriter replaces one sandbox's placeholders for one host.
type rewriter struct {
	names        []string
	placeholders []string
	values       []string
	headers      [][]string // each secret's header fields besides Authorization
	inURL        []bool
	// held says which secrets the sandbox holds (nil: all); only those
	// are put into its requests. The others stay in the lists, so that
	// their values are scrubbed from responses too.
	held  []bool
	scrub *scrubber // turns the values back into the placeholders
}

// rewriter returns the replacements for requests from sandbox to host;
// held names the secrets the sandbox holds (nil: all).
func (s *secretSet) rewriter(sandbox, host string, held map[string]bool) *rewriter {
	rw := &rewriter{}
	if held != nil {
		for _, i := range s.byHost[host] {
			rw.held = append(rw.held, held[s.secrets[i].Name])
		}
	}
	for _, i := range s.byHost[host] {
		sec := s.secrets[i]
		ph := s.placeholder(sandbox, sec.Name)
		rw.names = append(rw.names, sec.Name)
		rw.placeholders = append(rw.placeholders, ph)
		rw.values = append(rw.values, sec.Value)
		rw.headers = append(rw.headers, sec.Headers)
		rw.inURL = append(rw.inURL, sec.InURL)
	}
	rw.scrub = &scrubber{scrubIndex: s.scrubs[host], placeholders: rw.placeholders}
	if rw.scrub.scrubIndex == nil {
		rw.scrub.scrubIndex = &scrubIndex{}
	}
	return rw
}

// replace returns v with the placeholder of every secret i for which
// where(i) holds replaced by its value, and sets used[i] for each secret
// replaced.
func (rw *rewriter) replace(v string, used []bool, where func(i int) bool) string {
	if !strings.Contains(v, placeholderPrefix) {
		return v
	}
	for i, ph := range rw.placeholders {
		if (rw.held == nil || rw.held[i]) && where(i) && strings.Contains(v, ph) {
			v = strings.ReplaceAll(v, ph, rw.values[i])
			used[i] = true
		}
	}
	return v
}

// replaceURL replaces the placeholders of the secrets that go into the
// path and query (Secret.InURL) in a request target.
func (rw *rewriter) replaceURL(uri string, used []bool) string {
	return rw.replace(uri, used, func(i int) bool { return rw.inURL[i] })
}

// replaceHeader is replace for a value of the header field key (in
// canonical form): the placeholders of the secrets that go into that field
// (Authorization, or one of the secret's Headers) are replaced. "Basic"
// credentials are decoded, replaced and encoded again.
func (rw *rewriter) replaceHeader(key, v string, used []bool) string {
	where := func(i int) bool { return key == "Authorization" || slices.Contains(rw.headers[i], key) }
	if scheme, cred, ok := strings.Cut(v, " "); ok && strings.EqualFold(scheme, "Basic") {
		cred = strings.TrimSpace(cred)
		if raw, err := base64.StdEncoding.DecodeString(cred); err == nil {
			if r := rw.replace(string(raw), used, where); r != string(raw) {
				return scheme + " " + base64.StdEncoding.EncodeToString([]byte(r))
			}
		}
	}
	return rw.replace(v, used, where)
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

// SecretEnv returns "NAME=placeholder" for every secret the sandbox with
// this id holds (every secret, unless its Shape names some), as it sees
// them. A placeholder is worthless outside this proxy: it is replaced only
// in requests from that sandbox to the secret's hosts.
func (p *Proxy) SecretEnv(sandbox string) []string {
	if p.secrets == nil {
		return nil
	}
	held := p.heldBy(sandbox)
	env := make([]string, 0, len(p.secrets.secrets))
	for _, s := range p.secrets.secrets {
		if held == nil || held[s.Name] {
			env = append(env, s.Name+"="+p.secrets.placeholder(sandbox, s.Name))
		}
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
