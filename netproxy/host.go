package netproxy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Host name limits from RFC 1035.
const (
	maxHostLen  = 253
	maxLabelLen = 63
)

// hostKind says what normalizeHost found.
type hostKind int

const (
	hostName    hostKind = iota // a valid, normalised ASCII host name
	hostIP                      // a canonical IP literal
	hostInvalid                 // anything else; the problem string says why
)

// normalizeHost checks a host as written by a client or an operator and
// returns its normalised form: ASCII lowercase with one trailing dot removed.
//
// Non-ASCII input is refused before any case mapping (strings.ToLower maps
// the Kelvin sign U+212A to an ASCII 'k'), and nothing is IDNA-mapped: fullwidth
// digits, ideographic full stops and zero-width characters never reach a
// lookup. Names may hold only a-z, 0-9, '-', '_' and '.', in non-empty labels
// of at most 63 characters and 253 in all. A name whose last label is a number
// (decimal, or hex with 0x) is refused too, since C resolvers and browsers
// read "2130706433", "0x7f.1" or "127.1" as IPv4 addresses.
func normalizeHost(raw string) (norm string, kind hostKind, problem string) {
	for i := 0; i < len(raw); i++ {
		if raw[i] >= 0x80 {
			return "", hostInvalid, "the host name is not ASCII; write internationalised names in their punycode (xn--) form"
		}
	}
	h := strings.TrimSuffix(asciiLower(raw), ".")
	if _, err := netip.ParseAddr(h); err == nil {
		return h, hostIP, ""
	}
	if p := checkName(h); p != "" {
		return "", hostInvalid, p
	}
	return h, hostName, ""
}

// checkName validates an already lowercased host name without a trailing
// dot. It returns "" if the name is acceptable, or a sentence saying why not.
func checkName(h string) string {
	if h == "" {
		return "the host name is empty"
	}
	if len(h) > maxHostLen {
		return fmt.Sprintf("the host name is longer than %d characters", maxHostLen)
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_', c == '.':
		case c >= 0x80:
			return "the host name is not ASCII; write internationalised names in their punycode (xn--) form"
		default:
			return fmt.Sprintf("the host name contains %s; only letters, digits, '-', '_' and '.' are allowed", strconv.QuoteRuneToASCII(rune(c)))
		}
	}
	last := ""
	for label := range strings.SplitSeq(h, ".") {
		if label == "" {
			return "the host name has an empty label (a leading dot or \"..\")"
		}
		if len(label) > maxLabelLen {
			return fmt.Sprintf("the host name has a label longer than %d characters", maxLabelLen)
		}
		last = label
	}
	if isNumericLabel(last) {
		return "the host name ends in a number, so some software reads it as an IPv4 address; use a real host name"
	}
	return ""
}

// isNumericLabel reports whether a label is all decimal digits, or "0x"
// followed only by hex digits: the WHATWG URL "ends in a number" test.
func isNumericLabel(l string) bool {
	if strings.HasPrefix(l, "0x") {
		for i := 2; i < len(l); i++ {
			if !isHex(l[i]) {
				return false
			}
		}
		return true
	}
	for i := 0; i < len(l); i++ {
		if l[i] < '0' || l[i] > '9' {
			return false
		}
	}
	return l != ""
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f'
}

// asciiLower lowercases A-Z only, leaving every other byte alone.
func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// parsePort accepts only canonical decimal ports 1-65535: no sign, no leading
// zero, no service names. (net.SplitHostPort and strconv.Atoi accept "+443",
// "0443" and "99999".)
func parsePort(s string) (int, string) {
	bad := fmt.Sprintf("port %s is not valid: use a decimal number from 1 to 65535, without sign or leading zeros", strconv.QuoteToASCII(truncate(s, 16)))
	if s == "" {
		return 0, "the port is empty: use a decimal number from 1 to 65535"
	}
	if len(s) > 5 || s[0] == '0' {
		return 0, bad
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, bad
		}
		n = n*10 + int(s[i]-'0')
	}
	if n > 65535 {
		return 0, bad
	}
	return n, ""
}

// truncate shortens s to at most n bytes, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// quote renders untrusted input for a reason or log message: ASCII only (so it
// is safe in an HTTP header), quoted, and at most about 100 bytes long.
func quote(s string) string {
	return strconv.QuoteToASCII(truncate(s, 100))
}
