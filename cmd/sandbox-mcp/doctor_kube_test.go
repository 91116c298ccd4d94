package main

import (
	"strings"
	"testing"
)

// TestPidsVerdict: the doctor reads the agent's pids probe as the Go
// runtime and the probe write it (the stderr line is the runtime's own,
// copied from a run under docker --pids-limit 200).
func TestPidsVerdict(t *testing.T) {
	for _, c := range []struct {
		stdout, stderr string
		exit           int
		verdict, has   string
	}{
		{"cgroup max\n", "runtime: failed to create new OS thread (have 1019 already; errno=11)\nruntime: may need to increase max user processes (ulimit -u)\nfatal error: newosproc\n", 2, "ok", "about 1019"},
		{"cgroup max\nreached 4096\n", "", 0, "fail", "podPidsLimit"},
		{"cgroup max\n", "runtime: failed to create new OS thread (have 300 already; errno=12)\n", 2, "warn", "errno 12"},
		{"", "exec: not found", 127, "warn", "exited 127"},
	} {
		v, msg := pidsVerdict(c.stdout, c.stderr, c.exit)
		if v != c.verdict || !strings.Contains(msg, c.has) {
			t.Errorf("%q %q %d: %s %q, want %s with %q", c.stdout, c.stderr, c.exit, v, msg, c.verdict, c.has)
		}
	}
}
