package netproxy

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// An approved host is admitted at the next CONNECT, for that sandbox only:
// the same host stays refused to another sandbox of the same proxy.
func TestApproveAdmitsForOneSandbox(t *testing.T) {
	echoSrv := startServer(t, "tcp4", "127.0.0.1:0", echo)
	h := newHarness(t, Config{AllowPrivate: true})
	h.dialer.target = echoSrv.addr()
	h.res.setAddrs("pypi.org", "127.0.0.1")
	other := h.serve("sandbox-2")

	resp, body, _ := h.connect("pypi.org:443")
	if resp.StatusCode != 403 || !strings.Contains(body, "--allow-host") {
		t.Fatalf("before approval: %d %q, want 403 not on the list", resp.StatusCode, body)
	}
	if r := h.p.Refusals("sandbox-1", time.Time{}); len(r) != 1 || !r[0].Unlisted || r[0].Host != "pypi.org" {
		t.Fatalf("refusals = %+v, want one unlisted pypi.org", r)
	}
	if err := h.p.Approve("sandbox-1", "PyPI.org.", 443); err != nil {
		t.Fatal(err)
	}
	resp, body, c := h.connect("pypi.org:443")
	if resp.StatusCode != 200 {
		t.Fatalf("after approval: %d %q, want 200", resp.StatusCode, body)
	}
	expectEcho(t, c, "hello")
	c.Close()
	d := h.decisionList()
	if last := d[len(d)-1]; !last.Allow || last.Rule != "pypi.org:443 (approved for this sandbox)" {
		t.Errorf("decision = %+v, want allowed by the approval", last)
	}
	// Another port of the host is not approved.
	if resp, _, _ := h.connect("pypi.org:8443"); resp.StatusCode != 403 {
		t.Errorf("pypi.org:8443: %d, want 403", resp.StatusCode)
	}
	// Sandbox 2 never had it approved.
	resp, body, _ = roundTrip(t, other, connectReq("pypi.org:443"))
	if resp.StatusCode != 403 || !strings.Contains(body, "--allow-host") {
		t.Errorf("sandbox-2: %d %q, want 403", resp.StatusCode, body)
	}
	got := h.p.Allowed("sandbox-1")
	if !slices.Equal(got.Approved, []string{"pypi.org:443"}) || !slices.Equal(got.Base, []string{"api.example.com:443", "*.pkg.example.org:443"}) {
		t.Errorf("Allowed = %+v", got)
	}
	if got := h.p.Allowed("sandbox-2"); len(got.Approved) != 0 {
		t.Errorf("sandbox-2 Allowed = %+v, want nothing approved", got)
	}
	// Forget drops the layer.
	h.p.Forget("sandbox-1")
	if resp, _, _ := h.connect("pypi.org:443"); resp.StatusCode != 403 {
		t.Errorf("after Forget: %d, want 403", resp.StatusCode)
	}
}

// Approve takes one host name and port: no wildcard, no IP literal.
func TestApproveRefusesWhatIsNotOneName(t *testing.T) {
	h := newHarness(t, Config{})
	for _, host := range []string{"*.pypi.org", "127.0.0.1", "169.254.169.254", "[::1]", "", "a b", "pypi.org/x"} {
		if err := h.p.Approve("sandbox-1", host, 443); err == nil {
			t.Errorf("Approve(%q) = nil, want an error", host)
		}
	}
	if err := h.p.Approve("sandbox-1", "pypi.org", 0); err == nil {
		t.Error("Approve(port 0) = nil, want an error")
	}
	if got := h.p.Allowed("sandbox-1"); len(got.Approved) != 0 {
		t.Errorf("Allowed = %+v, want nothing approved", got)
	}
}

// An approved name is still checked where it resolves: private, loopback,
// link-local and metadata addresses stay refused, and the metadata and
// link-local ones even with AllowPrivate.
func TestApprovedNameKeepsAddressChecks(t *testing.T) {
	cases := []struct {
		addr         string
		allowPrivate bool
	}{
		{"10.1.2.3", false},
		{"127.0.0.1", false},
		{"192.168.1.1", false},
		{"169.254.169.254", false},
		{"169.254.169.254", true},
		{"169.254.10.10", true},
		{"fd00:ec2::254", true},
	}
	for _, tc := range cases {
		h := newHarness(t, Config{AllowPrivate: tc.allowPrivate})
		h.dialer.target = "127.0.0.1:1" // never reached
		h.res.setAddrs("evil.example.net", tc.addr)
		if err := h.p.Approve("sandbox-1", "evil.example.net", 443); err != nil {
			t.Fatal(err)
		}
		resp, body, _ := h.connect("evil.example.net:443")
		if resp.StatusCode != 403 || h.dialer.count() != 0 {
			t.Errorf("%s (AllowPrivate %v): %d %q after %d dials, want 403 and no dial", tc.addr, tc.allowPrivate, resp.StatusCode, body, h.dialer.count())
		}
		if r := h.p.Refusals("sandbox-1", time.Time{}); len(r) != 1 || r[0].Unlisted {
			t.Errorf("%s: refusals = %+v, want one that approval cannot lift", tc.addr, r)
		}
	}
}

// Narrowing wins over the base list and over approvals, and nothing
// approves a dropped host again; going offline refuses everything.
func TestNarrowWins(t *testing.T) {
	echoSrv := startServer(t, "tcp4", "127.0.0.1:0", echo)
	h := newHarness(t, Config{AllowPrivate: true})
	h.dialer.target = echoSrv.addr()
	h.res.setAddrs("api.example.com", "127.0.0.1")
	h.res.setAddrs("a.pkg.example.org", "127.0.0.1")
	h.res.setAddrs("pypi.org", "127.0.0.1")
	if err := h.p.Approve("sandbox-1", "pypi.org", 443); err != nil {
		t.Fatal(err)
	}
	other := h.serve("sandbox-2")

	if err := h.p.Narrow("sandbox-1", []string{"api.example.com", "pypi.org"}, false); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"api.example.com:443", "pypi.org:443"} {
		resp, body, _ := h.connect(target)
		if resp.StatusCode != 403 || !strings.Contains(body, "dropped") {
			t.Errorf("%s after the drop: %d %q, want 403 dropped", target, resp.StatusCode, body)
		}
	}
	if r := h.p.Refusals("sandbox-1", time.Time{}); len(r) != 2 || r[0].Unlisted || r[1].Unlisted {
		t.Errorf("refusals = %+v, want two that approval cannot lift", r)
	}
	if err := h.p.Approve("sandbox-1", "pypi.org", 443); !errors.Is(err, ErrNarrowed) {
		t.Errorf("Approve after the drop = %v, want ErrNarrowed", err)
	}
	// What was not dropped still works; sandbox-2 is untouched.
	if resp, _, c := h.connect("a.pkg.example.org:443"); resp.StatusCode != 200 {
		t.Errorf("a.pkg.example.org: %d, want 200", resp.StatusCode)
	} else {
		c.Close()
	}
	if resp, _, c := roundTrip(t, other, connectReq("api.example.com:443")); resp.StatusCode != 200 {
		t.Errorf("sandbox-2 api.example.com: %d, want 200", resp.StatusCode)
	} else {
		c.Close()
	}
	got := h.p.Allowed("sandbox-1")
	if len(got.Approved) != 0 || !slices.Equal(got.Dropped, []string{"api.example.com:443", "pypi.org:443"}) || got.Offline {
		t.Errorf("Allowed = %+v, want the approval gone and two drops", got)
	}

	if err := h.p.Narrow("sandbox-1", nil, true); err != nil {
		t.Fatal(err)
	}
	resp, body, _ := h.connect("a.pkg.example.org:443")
	if resp.StatusCode != 403 || !strings.Contains(body, "offline") {
		t.Errorf("offline: %d %q, want 403 offline", resp.StatusCode, body)
	}
	if err := h.p.Approve("sandbox-1", "other.example.com", 443); !errors.Is(err, ErrNarrowed) {
		t.Errorf("Approve when offline = %v, want ErrNarrowed", err)
	}
	// Narrowing again with nothing cannot widen.
	if err := h.p.Narrow("sandbox-1", nil, false); err != nil || !h.p.Allowed("sandbox-1").Offline {
		t.Errorf("Narrow(nil, false) = %v; offline = %v, want still offline", err, h.p.Allowed("sandbox-1").Offline)
	}
	if err := h.p.Narrow("sandbox-1", []string{"http://x"}, false); err == nil {
		t.Error("Narrow with an invalid entry = nil, want an error")
	}
}

// The layers are bounded whatever is asked.
func TestLayersBounded(t *testing.T) {
	h := newHarness(t, Config{})
	for i := range MaxApproved {
		if err := h.p.Approve("sandbox-1", "h"+itoa(i)+".example.com", 443); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.p.Approve("sandbox-1", "one-more.example.com", 443); err == nil {
		t.Error("approval past MaxApproved = nil, want an error")
	}
	var drop []string
	for i := range MaxDropped + 1 {
		drop = append(drop, "d"+itoa(i)+".example.com")
	}
	if err := h.p.Narrow("sandbox-1", drop, false); err == nil {
		t.Error("drops past MaxDropped = nil, want an error")
	}
}

// Granted admits what it grants for the sandbox it names, after the
// sandbox's lists; narrowing still wins, and the address checks still
// apply to what it admits.
func TestGrantedAfterListsBeforeRefusal(t *testing.T) {
	echoSrv := startServer(t, "tcp4", "127.0.0.1:0", echo)
	h := newHarness(t, Config{AllowPrivate: true})
	h.dialer.target = echoSrv.addr()
	h.res.setAddrs("pypi.org", "127.0.0.1")
	h.p.SetGranted(func(sandbox, host string, port int) (string, bool) {
		return "granted", sandbox == "sandbox-1" && host == "pypi.org" && port == 443
	})
	other := h.serve("sandbox-2")
	resp, body, c := h.connect("pypi.org:443")
	if resp.StatusCode != 200 {
		t.Fatalf("granted: %d %q, want 200", resp.StatusCode, body)
	}
	expectEcho(t, c, "hello")
	c.Close()
	if d := h.decisionList(); len(d) == 0 || d[len(d)-1].Rule != "granted" {
		t.Errorf("decisions = %+v, want the last allowed by the grant", d)
	}
	if resp, _, _ := roundTrip(t, other, connectReq("pypi.org:443")); resp.StatusCode != 403 {
		t.Errorf("sandbox-2: %d, want 403", resp.StatusCode)
	}
	if err := h.p.Narrow("sandbox-1", []string{"pypi.org"}, false); err != nil {
		t.Fatal(err)
	}
	if resp, body, _ := h.connect("pypi.org:443"); resp.StatusCode != 403 || !strings.Contains(body, "dropped") {
		t.Errorf("after the drop: %d %q, want 403", resp.StatusCode, body)
	}
}
