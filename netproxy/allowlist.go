package netproxy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// DefaultPort is the port of an allowlist entry that names none.
const DefaultPort = 443

// Allowlist is the set of host:port pairs the proxy may tunnel to. Build one
// with [ParseAllowlist]; it is immutable and safe for concurrent use.
//
// An entry is "host[:port]" or "*.domain[:port]"; the port defaults to 443.
// "host" matches that name only. "*.domain" matches every name that ends in
// ".domain", at any depth ("a.b.domain"), but not "domain" itself: allow the
// apex with its own entry. Matching is exact otherwise: ASCII case and one
// trailing dot are ignored, nothing else.
//
// Entries name hosts, never addresses: IP literals are refused when the list
// is parsed, and the proxy refuses IP-literal CONNECT targets.
//
// A nil or empty Allowlist matches nothing: the proxy then refuses every
// request. There is no way to write "allow everything".
type Allowlist struct {
	entries []string            // normalised, "host:port" or "*.domain:port", in input order
	exact   map[hostPort]string // host:port -> entry
	suffix  map[hostPort]string // domain:port (for "*.domain") -> entry
}

type hostPort struct {
	host string
	port int
}

// ParseAllowlist validates and normalises allowlist entries (see
// [Allowlist]). Surrounding spaces are trimmed, names are lowercased, one
// trailing dot is removed and duplicates are dropped. Every invalid entry is
// reported, each with a suggested fix. An empty list is valid and denies all.
func ParseAllowlist(entries []string) (*Allowlist, error) {
	a := &Allowlist{exact: map[hostPort]string{}, suffix: map[hostPort]string{}}
	var errs []error
	for _, raw := range entries {
		host, wildcard, port, problem := parseEntry(raw)
		if problem != "" {
			errs = append(errs, fmt.Errorf("allowlist entry %q: %s", truncate(raw, 100), problem))
			continue
		}
		key := hostPort{host, port}
		m, text := a.exact, host+":"+strconv.Itoa(port)
		if wildcard {
			m, text = a.suffix, "*."+text
		}
		if _, dup := m[key]; dup {
			continue
		}
		m[key] = text
		a.entries = append(a.entries, text)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return a, nil
}

// parseEntry checks one allowlist entry. For "*.domain" it returns the domain
// and wildcard=true.
func parseEntry(raw string) (host string, wildcard bool, port int, problem string) {
	s := strings.TrimSpace(raw)
	if s == "" {
		return "", false, 0, `the entry is empty; give a host such as "api.example.com" or "*.example.com:8443"`
	}
	if i := strings.Index(s, "://"); i >= 0 {
		return "", false, 0, fmt.Sprintf("remove the scheme: use %s", quote(cutAny(s[i+3:], "/?#")))
	}
	if strings.ContainsAny(s, "/?#") {
		return "", false, 0, fmt.Sprintf("an entry is a host and port, not a URL: use %s", quote(cutAny(s, "/?#")))
	}
	if strings.Contains(s, "@") {
		return "", false, 0, "an entry is a host and port; remove the user part before '@'"
	}
	if strings.HasPrefix(s, "[") {
		return "", false, 0, "IP addresses cannot be allowed, only host names; allow the name that serves this address"
	}

	h, portStr, hasPort := s, "", false
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		h, portStr, hasPort = s[:i], s[i+1:], true
	}
	if strings.Contains(h, ":") {
		return "", false, 0, "IP addresses cannot be allowed, only host names; allow the name that serves this address"
	}
	port = DefaultPort
	if hasPort {
		var p string
		if port, p = parsePort(portStr); p != "" {
			return "", false, 0, p
		}
	}
	portSuffix := ""
	if hasPort {
		portSuffix = ":" + portStr
	}

	if !isASCII(h) {
		return "", false, 0, fmt.Sprintf("host names must be ASCII: use the punycode form, e.g. %s", quote(punycodeHost(strings.TrimSuffix(h, "."))+portSuffix))
	}
	h = asciiLower(h)
	if h == "*." {
		return "", false, 0, fmt.Sprintf(`a wildcard needs a domain after "*.": use %s`, quote("*.example.com"+portSuffix))
	}
	h = strings.TrimSuffix(h, ".")

	if strings.Contains(h, "*") {
		domain, p, fixable := checkWildcard(h)
		if p != "" {
			if fixable {
				p += fmt.Sprintf(": use %s", quote(suggestWildcard(h)+portSuffix))
			}
			return "", false, 0, p
		}
		h, wildcard = domain, true
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return "", false, 0, "IP addresses cannot be allowed, only host names; allow the name that serves this address"
	}
	if p := checkName(h); p != "" {
		return "", false, 0, p
	}
	return h, wildcard, port, ""
}

// checkWildcard accepts only "*.domain" where domain has at least two labels
// and no further '*'. It returns the domain, or a problem and whether
// suggestWildcard has a useful fix for it.
func checkWildcard(h string) (domain, problem string, fixable bool) {
	switch {
	case h == "*":
		return "", `"*" would allow every host; list the hosts you need, or one domain with a wildcard`, true
	case !strings.HasPrefix(h, "*."), strings.Contains(h[2:], "*"):
		return "", `a wildcard may only be a whole first label`, true
	}
	domain = h[2:]
	if !strings.Contains(domain, ".") {
		return "", fmt.Sprintf("%s would allow a whole top-level domain; name a domain, as in %s", quote(h), quote("*.example."+domain)), false
	}
	return domain, "", false
}

// suggestWildcard proposes a valid wildcard for a malformed one:
// "*example.com" -> "*.example.com", "api.*.example.com" -> "*.example.com".
func suggestWildcard(h string) string {
	if strings.HasPrefix(h, "*") && !strings.HasPrefix(h, "*.") && !strings.Contains(h[1:], "*") {
		if s := "*." + h[1:]; strings.Count(s, ".") >= 2 {
			return s
		}
	}
	labels := strings.Split(h, ".")
	last := -1
	for i, l := range labels {
		if strings.Contains(l, "*") {
			last = i
		}
	}
	rest := labels[last+1:]
	if len(rest) < 2 || slices.Contains(rest, "") {
		return "*.example.com"
	}
	return "*." + strings.Join(rest, ".")
}

// cutAny returns s up to the first byte in chars.
func cutAny(s, chars string) string {
	if i := strings.IndexAny(s, chars); i >= 0 {
		return s[:i]
	}
	return s
}

// Match reports whether host:port is allowed, and by which entry (in its
// normalised form, as [Allowlist.Entries] lists it). host may be in any ASCII
// case and carry one trailing dot; a host that is not a valid ASCII name (an
// IP literal, non-ASCII, "*.x", ...) never matches. A nil Allowlist matches
// nothing.
func (a *Allowlist) Match(host string, port int) (rule string, ok bool) {
	if a == nil {
		return "", false
	}
	h, kind, _ := normalizeHost(host)
	if kind != hostName {
		return "", false
	}
	if rule, ok := a.exact[hostPort{h, port}]; ok {
		return rule, true
	}
	for i := 0; i < len(h); i++ {
		if h[i] == '.' {
			if rule, ok := a.suffix[hostPort{h[i+1:], port}]; ok {
				return rule, true
			}
		}
	}
	return "", false
}

// ports lists the ports on which the normalised name h is allowed, in
// ascending order, so a refusal can say "allowed on port 443 only".
func (a *Allowlist) ports(h string) []int {
	if a == nil {
		return nil
	}
	var ports []int
	for k := range a.exact {
		if k.host == h {
			ports = append(ports, k.port)
		}
	}
	for k := range a.suffix {
		if strings.HasSuffix(h, "."+k.host) {
			ports = append(ports, k.port)
		}
	}
	slices.Sort(ports)
	return slices.Compact(ports)
}

// Entries returns the normalised entries, each with its port ("api.example.com:443",
// "*.example.org:8443"), in the order given to [ParseAllowlist]. The result
// is a copy; it is empty for a nil Allowlist.
func (a *Allowlist) Entries() []string {
	if a == nil {
		return []string{}
	}
	return slices.Clone(a.entries)
}

// String returns the normalised entries joined by commas, for logs; "" when
// the list is empty.
func (a *Allowlist) String() string {
	if a == nil {
		return ""
	}
	return strings.Join(a.entries, ",")
}
