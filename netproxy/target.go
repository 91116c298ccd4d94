package netproxy

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// target is a checked CONNECT request target.
type target struct {
	host string // as requested (for logs)
	norm string // normalised name; "" unless the target is valid
	port int
}

// refusal is a request the proxy answers with an error status.
type refusal struct {
	status int
	reason string
}

// parseTarget accepts only a strict authority-form request target,
// "host:port" or "[ipv6]:port", and decides on it alone: the Host header is
// never consulted for CONNECT. Anything else — a URL, a path, user info,
// a missing or non-canonical port, an empty host — is a 400.
// IP literals are well-formed but always refused (403): the proxy connects
// to names on its allowlist only.
func parseTarget(uri string) (target, *refusal) {
	bad := func(format string, args ...any) (target, *refusal) {
		return target{host: truncate(uri, maxLoggedHost)}, &refusal{http.StatusBadRequest, fmt.Sprintf(format, args...)}
	}
	const form = `the CONNECT target must be "host:port", e.g. "api.example.com:443"`
	switch {
	case uri == "":
		return bad("the request target is empty; %s", form)
	case strings.Contains(uri, "://"):
		return bad("%s is a URL; %s", quote(uri), form)
	case strings.ContainsAny(uri, "/?#"):
		return bad("%s has a path or query; %s", quote(uri), form)
	case strings.Contains(uri, "@"):
		return bad("%s has user info ('@'); %s", quote(uri), form)
	}

	var hostPart, portPart string
	if strings.HasPrefix(uri, "[") {
		end := strings.IndexByte(uri, ']')
		if end < 0 {
			return bad("%s has an unclosed '['; %s", quote(uri), form)
		}
		rest := uri[end+1:]
		if !strings.HasPrefix(rest, ":") {
			return bad("%s has no port; %s", quote(uri), form)
		}
		hostPart, portPart = uri[:end+1], rest[1:]
	} else {
		i := strings.LastIndexByte(uri, ':')
		if i < 0 {
			return bad("%s has no port; use %s", quote(uri), quote(uri+":443"))
		}
		hostPart, portPart = uri[:i], uri[i+1:]
	}
	t := target{host: truncate(hostPart, maxLoggedHost)}
	if hostPart == "" {
		return bad("the CONNECT target has no host; %s", form)
	}
	port, problem := parsePort(portPart)
	if problem != "" {
		return bad("%s", problem)
	}
	t.port = port

	if strings.HasPrefix(hostPart, "[") {
		inner := strings.Replace(hostPart[1:len(hostPart)-1], "%25", "%", 1)
		if _, err := netip.ParseAddr(inner); err != nil || !strings.Contains(inner, ":") {
			return bad("%s is not a valid bracketed IPv6 address", quote(hostPart))
		}
		return t, ipLiteralRefusal(uri)
	}
	if strings.Contains(hostPart, ":") {
		return bad("%s looks like an IPv6 address without brackets; %s", quote(hostPart), form)
	}
	norm, kind, problem := normalizeHost(hostPart)
	switch kind {
	case hostIP:
		return t, ipLiteralRefusal(uri)
	case hostInvalid:
		return bad("%s is not a valid host name: %s", quote(hostPart), problem)
	}
	t.norm = norm
	return t, nil
}

func ipLiteralRefusal(uri string) *refusal {
	return &refusal{http.StatusForbidden, fmt.Sprintf(
		"%s is an IP address; this proxy only connects to host names on its --allow-host list", quote(uri))}
}
