package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

// lookupScript times one lookup of each resolver a model's programs use:
// the C library's (getent, and Python's getaddrinfo, which Node.js's
// dns.lookup also calls). It prints "<what> <milliseconds> <failed>".
const lookupScript = `t=$(date +%s%N); getent hosts pypi.org >/dev/null; rc=$?; echo "getent $(( ($(date +%s%N) - t) / 1000000 )) $rc"
python3 -c '
import socket, time
t = time.monotonic()
try:
    socket.getaddrinfo("pypi.org", 443)
    failed = 0
except OSError:
    failed = 1
print("python", int((time.monotonic() - t) * 1000), failed)
'`

// checkFastLookups runs lookupScript in s's sandbox: every lookup fails,
// each in under a second.
func checkFastLookups(t *testing.T, s *server) {
	t.Helper()
	out := s.ok("sandbox_exec", map[string]any{"command": lookupScript})
	lines := strings.Split(strings.TrimSpace(out["stdout"].(string)), "\n")
	if len(lines) != 2 {
		t.Fatalf("lookup timings: %v", out)
	}
	for _, l := range lines {
		f := strings.Fields(l)
		ms, _ := strconv.Atoi(f[1])
		t.Logf("%s lookup failed after %d ms", f[0], ms)
		if len(f) != 3 || f[2] == "0" || ms >= 1000 {
			t.Errorf("%s: a lookup took %d ms (exit %s), want a failure in under a second: %v", f[0], ms, f[2], out)
		}
	}
}

// TestNetworkFailuresAllowlist: under --network=allowlist every lookup in
// the sandbox fails at once (the proxy resolves what it tunnels to), and a
// command the proxy refused says so, in network_denied and in the hint that
// a text client shows, with the allowlist and who can change it.
func TestNetworkFailuresAllowlist(t *testing.T) {
	s := startServer(t, serverOpts{image: testenv.DefaultImage(t), args: []string{
		"--network", "allowlist", "--allow-host", "api.example.com:443"}})
	checkFastLookups(t, s)

	res := s.call("sandbox_exec", map[string]any{"argv": []string{"curl", "-sS", "--max-time", "20", "https://pypi.org/simple/"}})
	out := res.StructuredContent.(map[string]any)
	denied, _ := out["network_denied"].([]any)
	if len(denied) != 1 {
		t.Fatalf("network_denied %v: %v", out["network_denied"], out)
	}
	d := denied[0].(map[string]any)
	if d["host"] != "pypi.org" || d["port"] != float64(443) || !strings.Contains(d["reason"].(string), "not on this server's --allow-host list") {
		t.Errorf("network_denied[0] = %v", d)
	}
	for _, s := range []string{"The egress proxy refused pypi.org:443", "(allowed: api.example.com:443)", "only the server's operator can allow another host"} {
		if !strings.Contains(out["hint"].(string), s) || !strings.Contains(text(res), s) {
			t.Errorf("hint or text lacks %q:\nhint: %s\ntext: %s", s, out["hint"], text(res))
		}
	}
	// A background job's refusals are told when it is followed.
	job := s.ok("sandbox_exec", map[string]any{"argv": []string{"curl", "-sS", "https://registry.npmjs.org/"}, "background": true})["job"].(string)
	res = s.call("sandbox_job", map[string]any{"job": job, "wait_ms": 30000})
	out = res.StructuredContent.(map[string]any)
	if denied, _ := out["network_denied"].([]any); len(denied) != 1 || denied[0].(map[string]any)["host"] != "registry.npmjs.org" ||
		!strings.Contains(text(res), "The egress proxy refused registry.npmjs.org:443") {
		t.Errorf("a background job's refusal: %v\ntext: %s", out, text(res))
	}

	// Nothing refused while a later command ran: nothing reported.
	out = s.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})
	if out["network_denied"] != nil {
		t.Errorf("a command that reached for nothing: %v", out)
	}
}

// TestNetworkFailuresNone: under --network=none every lookup fails at once,
// and the package managers fail in seconds (npm took 73-78 s, past the
// default timeout; pip 10-25 s), with a result that says the sandbox has no
// network, to structured and text clients alike.
func TestNetworkFailuresNone(t *testing.T) {
	s := startServer(t, serverOpts{image: testenv.DefaultImage(t)})
	checkFastLookups(t, s)
	for _, tc := range []struct {
		command, host string
		within        time.Duration
	}{
		{"npm install left-pad", "registry.npmjs.org", 30 * time.Second},
		{"pip install requests", "", 30 * time.Second},
		{"curl -sS https://pypi.org/", "pypi.org", 5 * time.Second},
	} {
		start := time.Now()
		res := s.call("sandbox_exec", map[string]any{"command": tc.command, "timeout_ms": 60000})
		took := time.Since(start)
		out := res.StructuredContent.(map[string]any)
		t.Logf("%s failed after %s", tc.command, took.Round(time.Millisecond))
		if res.IsError || out["exit_code"] == nil || out["exit_code"].(float64) == 0 || took > tc.within {
			t.Errorf("%s: took %s (want a failure within %s): %v", tc.command, took, tc.within, out)
			continue
		}
		denied, _ := out["network_denied"].([]any)
		if len(denied) == 0 {
			t.Errorf("%s: no network_denied: %v", tc.command, out)
			continue
		}
		d := denied[0].(map[string]any)
		if tc.host != "" && d["host"] != tc.host || d["reason"] != "this sandbox has no network; nothing can be downloaded; use what the image has" {
			t.Errorf("%s: network_denied[0] = %v", tc.command, d)
		}
		if !strings.Contains(out["hint"].(string), "this sandbox has no network") || !strings.Contains(text(res), "this sandbox has no network") {
			t.Errorf("%s: hint or text does not say there is no network:\nhint: %s\ntext: %s", tc.command, out["hint"], text(res))
		}
	}
}
