package netproxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// stop ends the harness's Serve calls and waits for them to return.
func (h *harness) stop() {
	h.t.Helper()
	h.cancel()
	h.wg.Wait()
}

// refusalRecords splits decision records into refusals and the sum of
// their counts.
func refusalRecords(ds []Decision) (refused []Decision, counted int) {
	for _, d := range ds {
		if !d.Allow {
			refused = append(refused, d)
			counted += d.Count
		}
	}
	return refused, counted
}

// TestRefusalFloodIsBounded: a sandbox that floods the proxy with refused
// requests gets every one answered, but makes at most 2*MaxRefusalKinds+1
// records per interval, whose counts add up to the requests refused.
func TestRefusalFloodIsBounded(t *testing.T) {
	const kinds = 4
	h, _ := publicHarness(t, Config{RefusalInterval: time.Hour, MaxRefusalKinds: kinds, Rate: rate.Inf}, echo)

	resp, _, c := h.connect("api.example.com:443")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("allowed CONNECT: %d", resp.StatusCode)
	}
	expectEcho(t, c, "still works")
	c.Close()

	refused := 0
	send := func(n int, target func(i int) string, status int) {
		for i := range n {
			resp, body, _ := h.connect(target(i))
			if resp.StatusCode != status {
				t.Fatalf("%s: %d %q, want %d", target(i), resp.StatusCode, body, status)
			}
			refused++
		}
	}
	send(60, func(int) string { return "evil.com:443" }, http.StatusForbidden)
	send(60, func(int) string { return "nohost" }, http.StatusBadRequest)
	// Hostile hosts, each another kind, as long and as escaped as a
	// request can make them.
	long := strings.Repeat("\x01", 250)
	send(40, func(i int) string { return fmt.Sprintf("%s%d.evil.com:443", long, i) }, http.StatusBadRequest)

	// While the interval runs: the allowed request and the first refusal of
	// each of the first `kinds` kinds, no more.
	if ds := h.decisionList(); len(ds) != 1+kinds {
		t.Fatalf("%d records during the flood, want %d", len(ds), 1+kinds)
	}

	h.stop() // the sandbox's last Serve returns: the interval's summaries are written
	ds := h.decisionList()
	recs, counted := refusalRecords(ds)
	if len(recs) > 2*kinds+1 {
		t.Errorf("%d refusal records, want at most %d", len(recs), 2*kinds+1)
	}
	if counted != refused {
		t.Errorf("refusal records count %d requests, %d were refused", counted, refused)
	}
	want := map[string]int{"evil.com 403 false": 1, "evil.com 403 true": 59, "nohost 400 false": 1, "nohost 400 true": 59, " 0 true": 38}
	got := map[string]int{}
	for _, d := range recs {
		host := d.Host
		if strings.HasPrefix(host, long) {
			host = "long"
		}
		got[fmt.Sprintf("%s %d %v", host, d.Status, d.Summary)] += d.Count
		if d.Sandbox != "sandbox-1" || (d.Host != "" && !d.Client.IsLoopback()) {
			t.Errorf("record %+v: want the sandbox and the client address", d)
		}
	}
	want["long 400 false"] = 2
	for k, n := range want {
		if got[k] != n {
			t.Errorf("records %q count %d, want %d (all: %v)", k, got[k], n, got)
		}
	}

	logs := h.logs.records(t, "proxy decision")
	if len(logs) != len(ds) {
		t.Errorf("%d decision log lines, %d records", len(logs), len(ds))
	}
	longest := 0
	for line := range strings.SplitSeq(h.logs.String(), "\n") {
		longest = max(longest, len(line))
	}
	if longest > 4096 {
		t.Errorf("a log line of %d bytes", longest)
	}
	t.Logf("%d requests, %d records, the longest line %d bytes", refused+1, len(ds), longest)
}

// TestRefusalIntervalSummaries: when an interval ends, each kind that
// repeated gets one summary with its count, and the next refusal starts a
// new interval, recorded at once.
func TestRefusalIntervalSummaries(t *testing.T) {
	h := newHarness(t, Config{RefusalInterval: 200 * time.Millisecond, MaxRefusalKinds: 2, Rate: rate.Inf})
	waitSummary := func(count int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			ds := h.decisionList()
			if last := ds[len(ds)-1]; last.Summary {
				if last.Count != count || last.Host != "evil.com" || last.Status != http.StatusForbidden {
					t.Fatalf("summary %+v, want %d repeats of the 403 for evil.com", last, count)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no summary after the interval among %d records", len(ds))
			}
		}
	}
	for range 30 {
		h.connect("evil.com:443")
	}
	waitSummary(29)
	for range 5 {
		h.connect("evil.com:443")
	}
	waitSummary(4)
	ds := h.decisionList()
	if len(ds) != 4 || ds[0].Count != 1 || ds[0].Summary || ds[2].Count != 1 || ds[2].Summary {
		t.Fatalf("records %+v, want first, summary, first, summary", ds)
	}
	if logs := h.logs.records(t, "proxy decision"); len(logs) != 4 || logs[1]["count"] != float64(29) || logs[1]["summary"] != true {
		t.Fatalf("log records: %v", logs)
	}
}

// TestServeOnlyFromClients: a listener that names its sandbox's address
// refuses connections from any other address, and they take none of the
// sandbox's connection slots.
func TestServeOnlyFromClients(t *testing.T) {
	h, _ := publicHarness(t, Config{MaxConns: 1}, echo)
	sandboxAddr := netip.MustParseAddr("127.0.0.2")
	ln := listen(t)
	h.wg.Go(func() { h.p.Serve(h.ctx, ln, "sandbox-c", sandboxAddr) })

	dialFrom := func(from string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	stranger := dialFrom("127.0.0.1")
	io.WriteString(stranger, connectReq("api.example.com:443"))
	stranger.SetDeadline(time.Now().Add(5 * time.Second))
	answer := make([]byte, 512)
	n, _ := io.ReadAtLeast(stranger, answer, len("HTTP/1.1 403"))
	if !strings.HasPrefix(string(answer[:n]), "HTTP/1.1 403") {
		t.Fatalf("a connection from another address: %q", answer[:n])
	}
	// While the proxy still holds the stranger's connection (it reads
	// what is left before closing), the sandbox's one slot is free.
	own := dialFrom("127.0.0.2")
	io.WriteString(own, connectReq("api.example.com:443"))
	own.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, len("HTTP/1.1 200"))
	if _, err := io.ReadFull(own, buf); err != nil || string(buf) != "HTTP/1.1 200" {
		t.Fatalf("the sandbox's own address: %q %v", buf, err)
	}
	// The allowed decision is recorded once the tunnel's first bytes are
	// checked (they are not a TLS ClientHello here) and before they are
	// passed on: their echo means it is there.
	io.ReadFull(own, make([]byte, len(" Connection established\r\n\r\n")))
	expectEcho(t, own, "ping")
	rest, _ := io.ReadAll(stranger)
	if body := string(answer[:n]) + string(rest); !strings.Contains(body, "127.0.0.1 is not its address") {
		t.Errorf("the refusal does not say why: %q", body)
	}

	var sawStranger, sawOwn bool
	for _, d := range h.decisionList() {
		switch {
		case d.Sandbox == "sandbox-c" && !d.Allow && d.Client == netip.MustParseAddr("127.0.0.1"):
			sawStranger = d.Status == http.StatusForbidden && d.Host == ""
		case d.Sandbox == "sandbox-c" && d.Allow && d.Client == sandboxAddr:
			sawOwn = true
		}
	}
	if !sawStranger || !sawOwn {
		t.Errorf("decisions %+v: want the stranger's refusal and the sandbox's tunnel, each with its client", h.decisionList())
	}
}

// TestRefusalsRecentPerSandbox: Refusals tells what the proxy refused one
// sandbox since a moment (the start of a command), with the sentence sent to
// the client, keeps only the MaxRecentRefusals latest kinds, and says
// nothing of other sandboxes or of earlier refusals.
func TestRefusalsRecentPerSandbox(t *testing.T) {
	h, _ := publicHarness(t, Config{Rate: rate.Inf}, echo)
	other := h.serve("sandbox-2")

	before := time.Now()
	if got := h.p.Refusals("sandbox-1", before); len(got) != 0 {
		t.Fatalf("refusals before any request: %+v", got)
	}
	resp, _, c := h.connect("api.example.com:443")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("allowed CONNECT: %d", resp.StatusCode)
	}
	c.Close()
	for range 3 {
		if resp, body, _ := h.connect("PyPI.org:443"); resp.StatusCode != http.StatusForbidden {
			t.Fatalf("pypi.org: %d %q", resp.StatusCode, body)
		}
	}
	if resp, _, _ := roundTrip(t, other, connectReq("evil.example:443")); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("other sandbox: %d", resp.StatusCode)
	}
	got := h.p.Refusals("sandbox-1", before)
	if len(got) != 1 || got[0].Host != "pypi.org" || got[0].Port != 443 || got[0].Status != http.StatusForbidden || got[0].Count != 3 ||
		!strings.Contains(got[0].Reason, `"pypi.org:443" is not on this server's --allow-host list`) {
		t.Fatalf("sandbox-1 refusals: %+v", got)
	}
	if got := h.p.Refusals("sandbox-2", before); len(got) != 1 || got[0].Host != "evil.example" {
		t.Fatalf("sandbox-2 refusals: %+v", got)
	}
	if got := h.p.Refusals("sandbox-1", time.Now()); len(got) != 0 {
		t.Fatalf("refusals after the last one: %+v", got)
	}
	if got := h.p.Refusals("no-such-sandbox", before); got != nil {
		t.Fatalf("an unknown sandbox: %+v", got)
	}

	// Many kinds: only the latest MaxRecentRefusals are kept.
	for i := range 3 * MaxRecentRefusals {
		h.connect(fmt.Sprintf("host%d.example:443", i))
	}
	got = h.p.Refusals("sandbox-1", before)
	if len(got) != MaxRecentRefusals || got[0].Host != fmt.Sprintf("host%d.example", 2*MaxRecentRefusals) ||
		got[len(got)-1].Host != fmt.Sprintf("host%d.example", 3*MaxRecentRefusals-1) {
		t.Fatalf("after %d kinds, kept %d: %+v", 3*MaxRecentRefusals, len(got), got)
	}
}
