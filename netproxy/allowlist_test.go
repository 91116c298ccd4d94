package netproxy

import (
	"slices"
	"strings"
	"testing"
)

func TestParseAllowlistNormalises(t *testing.T) {
	a, err := ParseAllowlist([]string{
		" API.Example.COM. ", "api.example.com:443", "*.PKG.example.org", "*.pkg.example.org.:443",
		"files.example.net:8443", "localhost:8080", "under_score.example.com", "xn--bcher-kva.example",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"api.example.com:443", "*.pkg.example.org:443", "files.example.net:8443",
		"localhost:8080", "under_score.example.com:443", "xn--bcher-kva.example:443"}
	if got := a.Entries(); !slices.Equal(got, want) {
		t.Errorf("Entries() = %q, want %q", got, want)
	}
	if got := a.String(); got != strings.Join(want, ",") {
		t.Errorf("String() = %q", got)
	}
	// Entries returns a copy.
	a.Entries()[0] = "mutated"
	if a.Entries()[0] != want[0] {
		t.Error("Entries() exposes internal state")
	}
}

func TestParseAllowlistRejects(t *testing.T) {
	cases := []struct {
		entry string
		want  string // substring of the error, ideally the suggested fix
	}{
		{"*", `"*" would allow every host`},
		{"*.", `use "*.example.com"`},
		{"*:443", `use "*.example.com:443"`},
		{"*example.com", `use "*.example.com"`},
		{"api.*.example.com", `use "*.example.com"`},
		{"ap*.example.com", `use "*.example.com"`},
		{"*.*.example.com", `use "*.example.com"`},
		{"*.com", `as in "*.example.com"`},
		{"*.org:8443", `as in "*.example.org"`},
		{"éxample.com", `use the punycode form, e.g. "xn--xample-9ua.com"`},
		{"Bücher.example:8443", `"xn--bcher-kva.example:8443"`},
		{"１２７．０．０．１", "punycode"},
		{"127.0.0.1", "IP addresses cannot be allowed"},
		{"[::1]:443", "IP addresses cannot be allowed"},
		{"::1", "IP addresses cannot be allowed"},
		{"2130706433", "ends in a number"},
		{"127.1", "ends in a number"},
		{"example.0x10", "ends in a number"},
		{"api.example.com:0", "port"},
		{"api.example.com:65536", "port"},
		{"api.example.com:+443", "port"},
		{"api.example.com:0443", "port"},
		{"api.example.com:https", "port"},
		{"api.example.com:", "the port is empty"},
		{"https://api.example.com/v1", `remove the scheme: use "api.example.com"`},
		{"api.example.com/v1", `not a URL: use "api.example.com"`},
		{"user@api.example.com", "user part"},
		{"", "the entry is empty"},
		{"   ", "the entry is empty"},
		{"api..example.com", "empty label"},
		{".example.com", "empty label"},
		{"api example.com", `contains ' '`},
		{"api.example.com\x00", `contains '\x00'`},
		{strings.Repeat("a", 64) + ".example.com", "longer than 63"},
		{strings.Repeat("a.", 127) + "com", "longer than 253"},
	}
	for _, tc := range cases {
		t.Run(quote(tc.entry), func(t *testing.T) {
			a, err := ParseAllowlist([]string{"ok.example.com", tc.entry})
			if err == nil {
				t.Fatalf("ParseAllowlist accepted %q as %v", tc.entry, a.Entries())
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
			if a != nil {
				t.Error("a failed parse returned an allowlist")
			}
		})
	}
}

func TestParseAllowlistReportsEveryBadEntry(t *testing.T) {
	_, err := ParseAllowlist([]string{"*", "good.example.com", "10.0.0.1"})
	if err == nil || !strings.Contains(err.Error(), `"*"`) || !strings.Contains(err.Error(), `"10.0.0.1"`) {
		t.Errorf("error = %v, want both bad entries named", err)
	}
}

// Proxy case 39: an empty list denies everything; a nil list too.
func TestEmptyAllowlistDeniesAll(t *testing.T) {
	empty, err := ParseAllowlist(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []*Allowlist{empty, nil, {}} {
		for _, h := range []string{"api.example.com", "", "*", "localhost"} {
			if rule, ok := a.Match(h, 443); ok {
				t.Errorf("empty allowlist matched %q by %q", h, rule)
			}
		}
		if len(a.Entries()) != 0 || a.String() != "" {
			t.Errorf("empty allowlist lists %v", a.Entries())
		}
	}
}

func TestAllowlistMatch(t *testing.T) {
	a := mustAllowlist(t, "api.example.com", "*.pkg.example.org:443", "*.pkg.example.org:8443", "alt.example.com:8080")
	cases := []struct {
		host string
		port int
		rule string // "" = no match
	}{
		{"api.example.com", 443, "api.example.com:443"},
		{"API.EXAMPLE.COM", 443, "api.example.com:443"},
		{"api.example.com.", 443, "api.example.com:443"},
		{"api.example.com", 80, ""},
		{"api.example.com", 8443, ""},
		{"api.example.com..", 443, ""},
		{"x.api.example.com", 443, ""},
		{"example.com", 443, ""},
		{"evil-api.example.com", 443, ""},
		{"api.example.com.evil.net", 443, ""},
		{"apiexample.com", 443, ""},
		{"xapi.example.com", 443, ""},
		{"a.pkg.example.org", 443, "*.pkg.example.org:443"},
		{"a.pkg.example.org", 8443, "*.pkg.example.org:8443"},
		{"a.b.c.pkg.example.org", 443, "*.pkg.example.org:443"}, // any depth
		{"pkg.example.org", 443, ""},                            // not the apex
		{"xpkg.example.org", 443, ""},
		{"pkg.example.org.attacker.net", 443, ""},
		{"*.pkg.example.org", 443, ""},
		{".pkg.example.org", 443, ""},
		{"a.pkg.example.org\x00", 443, ""},
		{"а.pkg.example.org", 443, ""}, // Cyrillic а
		{"\u212apkg.example.org", 443, ""},
		{"alt.example.com", 8080, "alt.example.com:8080"},
		{"alt.example.com", 443, ""},
		{"93.184.216.34", 443, ""},
	}
	for _, tc := range cases {
		rule, ok := a.Match(tc.host, tc.port)
		if ok != (tc.rule != "") || rule != tc.rule {
			t.Errorf("Match(%q, %d) = %q, %v; want %q", tc.host, tc.port, rule, ok, tc.rule)
		}
	}
	if got := a.ports("api.example.com"); !slices.Equal(got, []int{443}) {
		t.Errorf("ports(api.example.com) = %v", got)
	}
	if got := a.ports("x.pkg.example.org"); !slices.Equal(got, []int{443, 8443}) {
		t.Errorf("ports(x.pkg.example.org) = %v", got)
	}
}

func TestPunycode(t *testing.T) {
	for in, want := range map[string]string{
		"bücher.example": "xn--bcher-kva.example",
		"münchen.de":     "xn--mnchen-3ya.de",
		"日本語.jp":         "xn--wgv71a119e.jp",
		"éxample.com":    "xn--xample-9ua.com",
		"BÜCHER":         "xn--bcher-kva",
		"ascii.only":     "ascii.only",
		// RFC 3492 7.1 (A) Arabic (Egyptian).
		"ليهمابتكلموشعربي؟": "xn--egbpdaj6bu4bxfgehfvwxn",
	} {
		if got := punycodeHost(in); got != want {
			t.Errorf("punycodeHost(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzAllowlistMatch(f *testing.F) {
	a, _ := ParseAllowlist([]string{"api.example.com", "*.pkg.example.org"})
	for _, s := range []string{"api.example.com", "a.pkg.example.org", "pkg.example.org", "*.pkg.example.org", "API.example.com."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		rule, ok := a.Match(host, 443)
		if !ok {
			return
		}
		// Anything that matches is a valid ASCII name that equals, or is a
		// proper subdomain of, an entry.
		h, kind, _ := normalizeHost(host)
		if kind != hostName {
			t.Fatalf("matched invalid host %q", host)
		}
		if h != "api.example.com" && !strings.HasSuffix(h, ".pkg.example.org") {
			t.Fatalf("%q matched %q", host, rule)
		}
	})
}
