package policy

import (
	"strings"
	"testing"
)

// TestCheckExposeAndWaitFor: sandbox_expose takes a TCP port, a bounded
// wait and a plain URL path; wait_for takes a bounded RE2 pattern with a
// job and a wait.
func TestCheckExposeAndWaitFor(t *testing.T) {
	for _, tc := range []struct {
		port int
		path string
		wait int64
		ok   bool
	}{
		{8000, "", 0, true}, {1, "docs/index.html", 60000, true}, {65535, "/app?x=1", 10, true},
		{0, "", 0, false}, {65536, "", 0, false}, {8000, "", -1, false}, {8000, "", 60001, false},
		{8000, "../x", 0, false}, {8000, "//evil.example/", 0, false}, {8000, "http://x/", 0, false},
		{8000, "a\nb", 0, false}, {8000, strings.Repeat("a", MaxExposePath+1), 0, false},
	} {
		if got := CheckExpose(tc.port, tc.path, tc.wait); got.Allow != tc.ok {
			t.Errorf("CheckExpose(%d, %q, %d) = %v, want allow %v", tc.port, tc.path, tc.wait, got, tc.ok)
		}
	}
	if re, d := CheckWaitFor(`Listening on \d+`, "3", 1000); !d.Allow || !re.MatchString("Listening on 8000") {
		t.Errorf("a good pattern: %v", d)
	}
	for _, tc := range []struct {
		pattern, job string
		wait         int64
	}{
		{"(unclosed", "3", 1000}, {`(a)\1`, "3", 1000}, {"x", "", 1000}, {"x", "3", 0},
		{strings.Repeat("a", MaxWaitFor+1), "3", 1000},
	} {
		if _, d := CheckWaitFor(tc.pattern, tc.job, tc.wait); d.Allow {
			t.Errorf("CheckWaitFor(%.20q, %q, %d) allowed", tc.pattern, tc.job, tc.wait)
		}
	}
}
