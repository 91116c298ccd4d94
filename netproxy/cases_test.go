package netproxy

import (
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

var itoa = strconv.Itoa

// Table tests for the egress proxy's cases in docs/attack-cases.md (the
// "proxy case" numbers below are that table's), run against a live Proxy on
// loopback with the allowlist {api.example.com:443, *.pkg.example.org:443},
// a fake resolver and a recording dialer. "Deny" means the expected status,
// the expected reason, exactly one decision record, and zero dials.
//
// Cases 29-30 (DNS from inside the container) and 50-52 (direct TCP from
// the container, the gateway's other ports, other sandboxes) are properties
// of the Docker network, not of this package; they are tested against Docker
// in session. Case 47 does not apply: sandboxes are told apart by listener,
// not by Proxy-Authorization (which is ignored and never logged, see
// TestLogRecords). Case 48 (SNI / domain fronting) is tested with the
// ClientHello check, in TestTunnelSNICheck.

// specialAddrs are proxy cases 1-15: each address, as a CONNECT IP literal and as
// the DNS answer for an allowed name, with the class Classify gives it.
var specialAddrs = []struct {
	row   int
	addr  string
	class string
}{
	{1, "127.0.0.1", ClassLoopback},
	{1, "127.255.255.254", ClassLoopback},
	{1, "::1", ClassLoopback},
	{2, "0.0.0.0", ClassUnspecified},
	{2, "::", ClassUnspecified},
	{2, "0.1.2.3", ClassThisNetwork},
	{3, "::ffff:127.0.0.1", ClassLoopback}, // mapped: the class of the IPv4 address
	{3, "::ffff:7f00:1", ClassLoopback},
	{3, "0:0:0:0:0:ffff:127.0.0.1", ClassLoopback},
	{4, "::ffff:0.0.0.0", ClassUnspecified},
	{5, "::127.0.0.1", ClassIPv4Compatible},
	{5, "::7f00:1", ClassIPv4Compatible},
	{6, "::ffff:0:7f00:1", ClassIPv4Translated},
	{7, "64:ff9b::a9fe:a9fe", ClassNAT64},
	{7, "64:ff9b::7f00:1", ClassNAT64},
	{7, "64:ff9b::808:808", ClassNAT64},
	{8, "64:ff9b:1::a9fe:a9fe", ClassNAT64},
	{9, "2002:7f00:1::1", Class6to4},
	{9, "2002:a9fe:a9fe::", Class6to4},
	{10, "2001:0:4136:e378:8000:63bf:3fff:fdd2", ClassTeredo},
	{11, "10.0.0.1", ClassPrivate},
	{11, "172.16.0.1", ClassPrivate},
	{11, "172.31.255.255", ClassPrivate},
	{11, "192.168.1.1", ClassPrivate},
	{11, "fc00::1", ClassPrivate},
	{11, "fd12::1", ClassPrivate},
	{12, "100.64.0.1", ClassCGNAT},
	{12, "100.127.255.254", ClassCGNAT},
	{12, "100.100.100.200", ClassMetadata},
	{13, "169.254.169.254", ClassMetadata},
	{13, "169.254.170.2", ClassMetadata},
	{13, "fe80::1", ClassLinkLocal},
	{13, "fe80::1%eth0", ClassLinkLocal},
	{14, "fd00:ec2::254", ClassMetadata},
	{14, "192.0.0.192", ClassMetadata},
	{14, "168.63.129.16", ClassMetadata},
	{15, "192.0.2.1", ClassDocumentation},
	{15, "198.51.100.1", ClassDocumentation},
	{15, "203.0.113.1", ClassDocumentation},
	{15, "198.18.0.1", ClassBenchmarking},
	{15, "240.0.0.1", ClassReserved},
	{15, "255.255.255.255", ClassBroadcast},
	{15, "224.0.0.1", ClassMulticast},
	{15, "ff02::1", ClassMulticast},
	{15, "100::1", ClassDiscard},
	{15, "2001:db8::1", ClassDocumentation},
	{15, "fec0::1", ClassSiteLocal},
}

// literal renders an address as a CONNECT target host.
func literal(a string) string {
	if strings.Contains(a, ":") {
		return "[" + strings.Replace(a, "%", "%25", 1) + "]"
	}
	return a
}

func TestSpecialIPLiteralsRefused(t *testing.T) {
	lits := []string{"8.8.8.8", "2001:4860:4860::8888", "100.63.255.255"} // proxy case 17: public
	for _, s := range specialAddrs {
		lits = append(lits, s.addr)
	}
	for _, a := range lits {
		t.Run(a, func(t *testing.T) {
			h := newHarness(t, Config{})
			target := literal(a) + ":443"
			resp, body, _ := h.connect(target)
			h.expectDeny(resp, body, http.StatusForbidden, "is an IP address")
			if n := h.res.total(); n != 0 {
				t.Errorf("%d lookups for an IP literal, want 0", n)
			}
		})
	}
}

func TestNamesResolvingToSpecialAddressesRefused(t *testing.T) {
	for _, s := range specialAddrs {
		t.Run(s.addr, func(t *testing.T) {
			h := newHarness(t, Config{})
			a := netip.MustParseAddr(s.addr)
			h.res.set("api.example.com", []netip.Addr{a})
			resp, body, _ := h.connect("api.example.com:443")
			d := h.expectDeny(resp, body, http.StatusForbidden, "("+s.class+")")
			if h.res.lookups("api.example.com") != 1 {
				t.Errorf("lookups = %d, want 1", h.res.lookups("api.example.com"))
			}
			if len(d.Resolved) != 1 || d.Resolved[0] != a.WithZone("") || d.Addr != a.Unmap().WithZone("") {
				t.Errorf("decision resolved=%v addr=%v, want [%v] and %v", d.Resolved, d.Addr, a.WithZone(""), a.Unmap().WithZone(""))
			}
			if d.Rule != "api.example.com:443" {
				t.Errorf("decision rule = %q", d.Rule)
			}
		})
	}
}

// Proxy case 12: the addresses just outside CGNAT are public and go through.
func TestCGNATNeighboursArePublic(t *testing.T) {
	for _, a := range []string{"100.63.255.255", "100.128.0.1", "168.63.129.15", "2001:4860:4860::8888"} {
		t.Run(a, func(t *testing.T) {
			h := newHarness(t, Config{})
			echoSrv := startServer(t, "tcp", "127.0.0.1:0", echo)
			h.dialer.target = echoSrv.addr()
			h.res.setAddrs("api.example.com", a)
			resp, body, c := h.connect("api.example.com:443")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d %q, want 200", resp.StatusCode, body)
			}
			expectEcho(t, c, "ping")
			want := []string{"tcp4 " + netip.AddrPortFrom(netip.MustParseAddr(a), 443).String()}
			if netip.MustParseAddr(a).Is6() {
				want[0] = "tcp6 " + netip.AddrPortFrom(netip.MustParseAddr(a), 443).String()
			}
			if got := h.dialer.list(); len(got) != 1 || got[0] != want[0] {
				t.Errorf("dials = %v, want %v", got, want)
			}
		})
	}
}

// expectDeny checks a refusal: status, reason in body and header, zero
// dials, exactly one decision (returned).
func (h *harness) expectDeny(resp *http.Response, body string, status int, reason string) Decision {
	h.t.Helper()
	if resp.StatusCode != status {
		h.t.Errorf("status = %d (%q), want %d", resp.StatusCode, body, status)
	}
	if !strings.Contains(body, reason) {
		h.t.Errorf("body %q does not contain %q", body, reason)
	}
	if got := resp.Header.Get(ErrorHeader); got == "" || got != strings.TrimSuffix(body, "\n") {
		h.t.Errorf("%s = %q, want the body %q", ErrorHeader, got, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		h.t.Errorf("Content-Type = %q", ct)
	}
	if n := h.dialer.count(); n != 0 {
		h.t.Errorf("%d dials for a denied request (%v), want 0", n, h.dialer.list())
	}
	ds := h.decisionList()
	if len(ds) != 1 {
		h.t.Fatalf("%d decisions, want 1: %+v", len(ds), ds)
	}
	d := ds[0]
	if d.Allow || d.Status != status || d.Reason != strings.TrimSuffix(body, "\n") || d.Sandbox != "sandbox-1" {
		h.t.Errorf("decision = %+v, want a refusal with status %d and the body as reason", d, status)
	}
	if logs := h.logs.records(h.t, "proxy decision"); len(logs) != 1 {
		h.t.Errorf("%d decision log records, want 1", len(logs))
	}
	return d
}

type reqCase struct {
	row     int
	name    string
	raw     string // the whole request; default connectReq(target)
	target  string
	status  int
	reason  string
	answers map[string]string // name -> address, for allowed cases
}

func runReqCases(t *testing.T, cases []reqCase) {
	t.Helper()
	for _, tc := range cases {
		name := tc.name
		if name == "" {
			name = tc.target
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, Config{})
			echoSrv := startServer(t, "tcp", "127.0.0.1:0", echo)
			h.dialer.target = echoSrv.addr()
			for n, a := range tc.answers {
				h.res.setAddrs(n, a)
			}
			raw := tc.raw
			if raw == "" {
				raw = connectReq(tc.target)
			}
			resp, body, c := roundTrip(t, h.addr, raw)
			if tc.status == http.StatusOK {
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("row %d: status %d %q, want 200", tc.row, resp.StatusCode, body)
				}
				expectEcho(t, c, "hello")
				return
			}
			h.expectDeny(resp, body, tc.status, tc.reason)
			if n := h.res.total(); n != 0 {
				t.Errorf("row %d: %d lookups, want 0 (refused before DNS)", tc.row, n)
			}
		})
	}
}

func TestNumericHostsRefusedBeforeDNS(t *testing.T) {
	const numeric = "ends in a number"
	const nonASCII = "not ASCII"
	var cases []reqCase
	for _, h := range []string{"2130706433", "017700000001", "0x7f000001", "0177.0.0.1", "0x7f.0.0.1",
		"127.1", "127.0.1", "127.000.000.001", "0", "0x7f.1", "api.0x1", "2852039166"} {
		cases = append(cases, reqCase{row: 18, target: h + ":443", status: 400, reason: numeric})
	}
	for _, h := range []string{"①②⑦.⓪.⓪.①", "１２７．０．０．１", "169。254。169。254"} {
		cases = append(cases, reqCase{row: 20, target: h + ":443", status: 400})
	}
	for _, h := range []string{"localhost", "LOCALHOST", "localhost.", "foo.localhost", "localtest.me",
		"127.0.0.1.nip.io", "metadata.google.internal", "metadata"} {
		cases = append(cases, reqCase{row: 21, target: h + ":443", status: 403, reason: "is not on this server's --allow-host list"})
	}
	runReqCases(t, cases)
}

// Proxy case 21, second half: an allowed name that resolves to loopback is still
// refused, with the real pure-Go resolver reading /etc/hosts.
func TestAllowedLocalhostStillRefusedForLoopback(t *testing.T) {
	canary := startServer(t, "tcp", "127.0.0.1:0", nil)
	port := canary.port()
	h := newHarness(t, Config{Allow: mustAllowlist(t, "localhost:"+itoa(port))}, realDialer,
		func(h *harness, c *Config) { c.Resolver = nil })
	resp, body, _ := h.connect("localhost:" + itoa(port))
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "(loopback)") {
		t.Errorf("status %d %q, want 403 loopback", resp.StatusCode, body)
	}
	if n := canary.accepts.Load(); n != 0 {
		t.Errorf("canary accepted %d connections", n)
	}
}

func TestDNSAnswersClassified(t *testing.T) {
	t.Run("22 allowed name resolves to loopback", func(t *testing.T) {
		h := newHarness(t, Config{})
		h.res.setAddrs("api.example.com", "127.0.0.1")
		resp, body, _ := h.connect("api.example.com:443")
		h.expectDeny(resp, body, 403, `"api.example.com" resolved to 127.0.0.1 (loopback)`)
		rec := h.logs.records(t, "proxy decision")[0]
		if rec["addr"] != "127.0.0.1" || rec["rule"] != "api.example.com:443" ||
			len(rec["resolved"].([]any)) != 1 || rec["resolved"].([]any)[0] != "127.0.0.1" {
			t.Errorf("decision log = %v, want resolved [127.0.0.1], addr and rule", rec)
		}
	})
	for _, answer := range [][]string{
		{"93.184.216.34", "10.0.0.1"},
		{"10.0.0.1", "93.184.216.34"},
		{"2606:2800:220:1:248:1893:25c8:1946", "::1"},
	} {
		t.Run("23 mixed answer is refused whole "+strings.Join(answer, ","), func(t *testing.T) {
			h := newHarness(t, Config{})
			h.res.setAddrs("api.example.com", answer...)
			resp, body, _ := h.connect("api.example.com:443")
			d := h.expectDeny(resp, body, 403, "resolved to")
			if len(d.Resolved) != 2 {
				t.Errorf("decision resolved = %v, want both answers", d.Resolved)
			}
		})
	}
	for _, a := range []string{"::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe"} {
		t.Run("25 AAAA-only embedded metadata "+a, func(t *testing.T) {
			h := newHarness(t, Config{AllowPrivate: true})
			h.res.setAddrs("api.example.com", a)
			resp, body, _ := h.connect("api.example.com:443")
			h.expectDeny(resp, body, 403, "always refuses")
		})
	}
	t.Run("26 CNAME chain to an internal address", func(t *testing.T) {
		h := newHarness(t, Config{})
		h.res.setAddrs("api.example.com", "10.1.2.3") // the resolver's final answer
		resp, body, _ := h.connect("api.example.com:443")
		h.expectDeny(resp, body, 403, "(private)")
	})
	t.Run("27 hanging resolver", func(t *testing.T) {
		h := newHarness(t, Config{DNSTimeout: 100 * time.Millisecond})
		h.res.hang["api.example.com"] = true
		start := time.Now()
		resp, body, _ := h.connect("api.example.com:443")
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("answered after %v, want about the DNS timeout (100ms)", el)
		}
		h.expectDeny(resp, body, 502, "timed out after 100ms")
	})
	t.Run("28 NXDOMAIN", func(t *testing.T) {
		h := newHarness(t, Config{})
		resp, body, _ := h.connect("api.example.com:443")
		h.expectDeny(resp, body, 502, `could not resolve "api.example.com": no such host`)
	})
	t.Run("the lookup is rooted and asks for both families", func(t *testing.T) {
		h := newHarness(t, Config{})
		h.connect("api.example.com:443")
		if got := h.res.nets; len(got) != 1 || got[0] != "ip api.example.com." {
			t.Errorf("lookups = %q, want [\"ip api.example.com.\"]", got)
		}
	})
}

// Proxy case 24: one lookup per CONNECT, the checked address is the dialled one,
// and a rebound answer is refused.
func TestOneLookupPerConnectDefeatsRebinding(t *testing.T) {
	h := newHarness(t, Config{})
	echoSrv := startServer(t, "tcp", "127.0.0.1:0", echo)
	h.dialer.target = echoSrv.addr()
	h.res.set("api.example.com",
		[]netip.Addr{netip.MustParseAddr("93.184.216.34")},
		[]netip.Addr{netip.MustParseAddr("127.0.0.1")})

	resp, _, c := h.connect("api.example.com:443")
	if resp.StatusCode != 200 {
		t.Fatalf("first CONNECT: %d", resp.StatusCode)
	}
	expectEcho(t, c, "x")
	if got := h.dialer.list(); len(got) != 1 || got[0] != "tcp4 93.184.216.34:443" {
		t.Errorf("dials = %v, want exactly the checked address", got)
	}
	if n := h.res.lookups("api.example.com"); n != 1 {
		t.Errorf("lookups after one CONNECT = %d, want 1", n)
	}
	resp, body, _ := h.connect("api.example.com:443")
	if resp.StatusCode != 403 || !strings.Contains(body, "(loopback)") {
		t.Errorf("second CONNECT: %d %q, want 403 loopback", resp.StatusCode, body)
	}
	if n := h.res.lookups("api.example.com"); n != 2 {
		t.Errorf("lookups after two CONNECTs = %d, want 2", n)
	}
	if n := h.dialer.count(); n != 1 {
		t.Errorf("dials = %d, want 1", n)
	}
}

func TestHostMatching(t *testing.T) {
	const notListed = "is not on this server's --allow-host list"
	pub := map[string]string{"api.example.com": "93.184.216.34", "a.b.pkg.example.org": "93.184.216.35",
		"x.pkg.example.org": "93.184.216.36"}
	cases := []reqCase{
		{row: 31, target: "API.Example.COM:443", status: 200, answers: pub},
		{row: 31, target: "api.example.com.:443", status: 200, answers: pub},
		{row: 34, target: "a.b.pkg.example.org:443", status: 200, answers: pub},
		{row: 34, target: "X.PKG.example.org.:443", status: 200, answers: pub},
		{row: 33, target: "pkg.example.org:443", status: 403, reason: notListed},
		{row: 37, target: "api_example.com:443", status: 403, reason: notListed},
	}
	for _, h := range []string{"evil-api.example.com", "api.example.com.evil.net", "apiexample.com",
		"xapi.example.com", "api.example.co", "evil.pkg.example.org.attacker.net", "pkg.example.org.attacker.net",
		"example.com", "xpkg.example.org"} {
		cases = append(cases, reqCase{row: 32, target: h + ":443", status: 403, reason: notListed})
	}
	for _, h := range []string{"аpi.example.com", "ａｐｉ.example.com", "api\u200b.example.com", "api.example.com\u212a"} {
		cases = append(cases, reqCase{row: 36, name: quote(h), target: h + ":443", status: 400})
	}
	cases = append(cases,
		reqCase{row: 37, target: "api.example.com%00.evil.net:443", status: 400, reason: "not a valid host name"},
		reqCase{row: 37, name: "NUL", raw: "CONNECT api.example.com\x00:443 HTTP/1.1\r\n\r\n", status: 400},
		reqCase{row: 37, name: "space", raw: "CONNECT api.example.com :443 HTTP/1.1\r\n\r\n", status: 400},
		reqCase{row: 37, target: "*.pkg.example.org:443", status: 400, reason: "not a valid host name"},
		reqCase{row: 38, name: "254-char host", target: strings.Repeat("a.", 126) + "pkg.example.org:443", status: 400, reason: "longer than 253"},
		reqCase{row: 38, name: "64-char label", target: strings.Repeat("a", 64) + ".pkg.example.org:443", status: 400, reason: "longer than 63"},
		reqCase{row: 38, name: "10000-char request line", target: strings.Repeat("a", 10000) + ":443", status: 431, reason: "larger than 8192 bytes"},
	)
	runReqCases(t, cases)
}

// Proxy case 31: the decision and its log show the normalised name.
func TestLogShowsNormalizedName(t *testing.T) {
	h := newHarness(t, Config{})
	echoSrv := startServer(t, "tcp", "127.0.0.1:0", echo)
	h.dialer.target = echoSrv.addr()
	h.res.setAddrs("api.example.com", "93.184.216.34")
	resp, _, c := h.connect("API.Example.COM.:443")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	c.Close()
	h.waitCloses(1)
	rec := h.logs.records(t, "proxy decision")
	if len(rec) != 1 || rec[0]["host"] != "API.Example.COM." || rec[0]["normalized"] != "api.example.com" ||
		rec[0]["allow"] != true || rec[0]["status"] != float64(200) || rec[0]["addr"] != "93.184.216.34" {
		t.Errorf("decision log = %v", rec)
	}
}

func TestMalformedRequestShapesRefused(t *testing.T) {
	pub := map[string]string{"api.example.com": "93.184.216.34"}
	cases := []reqCase{
		{row: 40, target: "api.example.com:22", status: 403, reason: "is allowed on port 443 only"},
		{row: 40, target: "api.example.com:80", status: 403, reason: "is allowed on port 443 only"},
		{row: 40, target: "api.example.com:8443", status: 403, reason: "is allowed on port 443 only"},
		{row: 40, target: "evil.com:443", status: 403, reason: `"evil.com:443" is not on this server's --allow-host list`},
		{row: 41, target: "api.example.com", status: 400, reason: `has no port; use "api.example.com:443"`},
		{row: 41, target: ":443", status: 400, reason: "no host"},
		{row: 41, target: "[::1]", status: 400, reason: "no port"},
		{row: 41, target: "[::1", status: 400, reason: "unclosed"},
		{row: 41, target: "[fe80::1%25eth0]:443", status: 403, reason: "is an IP address"},
		{row: 41, target: "::1:443", status: 400, reason: "without brackets"},
		{row: 41, target: "[not-an-ip]:443", status: 400, reason: "not a valid bracketed IPv6"},
		{row: 41, target: "[127.0.0.1]:443", status: 400, reason: "not a valid bracketed IPv6"},
		{row: 42, target: "api.example.com:443@evil.com:443", status: 400, reason: "user info"},
		{row: 42, target: "api.example.com:443/x", status: 400, reason: "path"},
		{row: 42, target: "http://api.example.com:443", status: 400, reason: "is a URL"},
		{row: 43, name: "Host header ignored", raw: "CONNECT api.example.com:443 HTTP/1.1\r\nHost: evil.com:443\r\n\r\n",
			status: 200, answers: pub},
		{row: 43, name: "no Host header", raw: "CONNECT api.example.com:443 HTTP/1.1\r\n\r\n", status: 200, answers: pub},
		{row: 43, name: "HTTP/1.0", raw: "CONNECT api.example.com:443 HTTP/1.0\r\n\r\n", status: 200, answers: pub},
		{row: 44, name: "absolute-form GET", raw: "GET http://api.example.com/ HTTP/1.1\r\nHost: evil.com\r\n\r\n",
			status: 405, reason: "only tunnels HTTPS with CONNECT"},
		{row: 45, name: "userinfo GET", raw: "GET http://evil.com@api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
			status: 405, reason: "only tunnels HTTPS"},
		{row: 45, name: "duplicate Host", raw: "GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\nHost: evil.com\r\n\r\n",
			status: 405, reason: "only tunnels HTTPS"},
		{row: 45, name: "origin-form", raw: "GET /path HTTP/1.1\r\nHost: evil.com\r\n\r\n", status: 405, reason: "only tunnels HTTPS"},
		{row: 45, name: "HTTP/1.0 no Host", raw: "GET /path HTTP/1.0\r\n\r\n", status: 405, reason: "only tunnels HTTPS"},
		{row: 45, name: "POST absolute", raw: "POST http://api.example.com:443/ HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 3\r\n\r\nabc",
			status: 405, reason: "only tunnels HTTPS"},
		{row: 45, name: "HTTP/2 preface", raw: "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", status: 400, reason: "unsupported protocol"},
		{row: 45, name: "HTTP/0.9", raw: "GET /\r\n\r\n", status: 400, reason: "malformed request line"},
		{row: 45, name: "bad header line", raw: "CONNECT api.example.com:443 HTTP/1.1\r\nno colon here\r\n\r\n", status: 400, reason: "malformed request header"},
		{row: 46, name: "Content-Length", raw: "CONNECT api.example.com:443 HTTP/1.1\r\nContent-Length: 10\r\n\r\n",
			status: 400, reason: "must not have a body"},
		{row: 46, name: "Transfer-Encoding", raw: "CONNECT api.example.com:443 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
			status: 400, reason: "must not have a body"},
		{row: 46, name: "Content-Length 0 is tolerated", raw: "CONNECT api.example.com:443 HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
			status: 200, answers: pub},
		{row: 38, name: "TLS bytes", raw: "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", status: 400, reason: "malformed request line"},
	}
	for _, port := range []string{"0", "65536", "-1", "+443", "0443", "https", "99999", "", "4 43", "443 "} {
		cases = append(cases, reqCase{row: 40, name: "port " + quote(port), target: "api.example.com:" + port, status: 400})
	}
	runReqCases(t, cases)
}

// Proxy case 23 (policy detail): with several acceptable answers the first is
// dialled, once; if it fails there is no fallback to the others.
func TestFirstAnswerOnlyNoFallback(t *testing.T) {
	h, _ := publicHarness(t, Config{}, echo)
	h.res.setAddrs("api.example.com", "93.184.216.34", "93.184.216.35", "2606:2800:220:1:248:1893:25c8:1946")
	resp, _, c := h.connect("api.example.com:443")
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	expectEcho(t, c, "x")
	if got := h.dialer.list(); len(got) != 1 || got[0] != "tcp4 93.184.216.34:443" {
		t.Errorf("dials = %v, want only the first answer", got)
	}

	h2 := newHarness(t, Config{})
	h2.res.setAddrs("api.example.com", "93.184.216.34", "93.184.216.35")
	h2.dialer.refuse = map[string]bool{"93.184.216.34:443": true}
	resp, body, _ := h2.connect("api.example.com:443")
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "connection refused") {
		t.Errorf("status %d %q, want 502 connection refused", resp.StatusCode, body)
	}
	if got := h2.dialer.list(); len(got) != 1 {
		t.Errorf("dials = %v, want one (no fallback)", got)
	}
}

// Proxy case 38: MaxHeaderBytes is exact, not rounded up to the read buffer.
func TestHeaderLimitIsExact(t *testing.T) {
	for _, tc := range []struct {
		size   int
		status int
	}{{DefaultMaxHeaderBytes - 10, http.StatusForbidden}, {DefaultMaxHeaderBytes + 10, http.StatusRequestHeaderFieldsTooLarge}} {
		h := newHarness(t, Config{})
		req := "CONNECT evil.com:443 HTTP/1.1\r\nX-Pad: "
		req += strings.Repeat("p", tc.size-len(req)-4) + "\r\n\r\n"
		if len(req) != tc.size {
			t.Fatalf("built %d bytes", len(req))
		}
		if resp, body, _ := roundTrip(t, h.addr, req); resp.StatusCode != tc.status {
			t.Errorf("%d-byte header: %d %q, want %d", tc.size, resp.StatusCode, body, tc.status)
		}
	}
}

// Whatever the target, parseTarget either refuses it or yields a valid
// ASCII name and port; an accepted target is never an IP address.
func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"api.example.com:443", "[::1]:443", "127.1:443", "a:443@b:443", "http://a:1",
		"１２７．０．０．１:443", "x.:1", ":443", "[fe80::1%25eth0]:443", "0x7f.1:80", "a..b:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, uri string) {
		tg, ref := parseTarget(uri)
		if ref != nil {
			if ref.status != http.StatusBadRequest && ref.status != http.StatusForbidden {
				t.Fatalf("status %d", ref.status)
			}
			return
		}
		if checkName(tg.norm) != "" || tg.port < 1 || tg.port > 65535 {
			t.Fatalf("accepted %q as %q port %d", uri, tg.norm, tg.port)
		}
		if _, err := netip.ParseAddr(tg.norm); err == nil {
			t.Fatalf("accepted IP literal %q", uri)
		}
		if tg.norm+":"+strconv.Itoa(tg.port) != strings.TrimSuffix(asciiLower(uri[:strings.LastIndexByte(uri, ':')]), ".")+uri[strings.LastIndexByte(uri, ':'):] {
			t.Fatalf("%q normalised to %q:%d", uri, tg.norm, tg.port)
		}
	})
}
