package main

import (
	"strings"
	"testing"
)

// TestStdioLongCallReturnsRunning: through a real client, a foreground
// exec still running at --max-call-wait returns running: true with its
// job, the output so far and a hint to follow it with sandbox_job wait_ms,
// and without the exit fields; the command goes on as its job and
// sandbox_job reads the rest and its end. The instructions say so. A
// background start has no exit fields either.
func TestStdioLongCallReturnsRunning(t *testing.T) {
	s := startServer(t, serverOpts{args: []string{"--max-call-wait", "2s"}})
	if ins := s.cs.InitializeResult().Instructions; !strings.Contains(ins, "A call returns within 2s") || !strings.Contains(ins, "wait_ms") {
		t.Errorf("the instructions do not say a call returns by --max-call-wait: %q", ins)
	}

	res := s.call("sandbox_exec", map[string]any{"command": "echo first; sleep 5; echo second"})
	r, _ := res.StructuredContent.(map[string]any)
	if res.IsError || r["running"] != true || r["job"] == "" || r["stdout"] != "first\n" {
		t.Fatalf("a call past --max-call-wait: %s", text(res))
	}
	for _, k := range []string{"exit_code", "duration_ms"} {
		if _, ok := r[k]; ok {
			t.Errorf("a running command's result has %s: %v", k, r)
		}
	}
	if hint := r["hint"].(string); !strings.Contains(hint, "sandbox_job") || !strings.Contains(hint, "wait_ms") {
		t.Errorf("the hint does not say how to follow the job: %q", hint)
	}
	if txt := text(res); !strings.Contains(txt, "running as job "+r["job"].(string)) || !strings.Contains(txt, "first") {
		t.Errorf("the text does not say the command runs on: %q", txt)
	}
	out, end := pollJob(t, s, r["job"].(string), func(_ string, r map[string]any) bool { return r["state"] != "running" })
	if out != "second\n" || end["state"] != "exited" || num(t, end, "exit_code") != 0 {
		t.Fatalf("the job after the call returned: %q %v", out, end)
	}

	bg := s.ok("sandbox_exec", map[string]any{"command": "sleep 1", "background": true})
	for _, k := range []string{"exit_code", "duration_ms"} {
		if _, ok := bg[k]; ok {
			t.Errorf("a background start has %s: %v", k, bg)
		}
	}
}

// followRunning finishes a foreground sandbox_exec result that came back
// running (the command ran past --max-call-wait, as one may on a loaded
// machine) the way a model does: it reads the job with wait_ms until it
// ends, and returns the result as if the call had waited (the output
// joined, the job's exit code). Other results are returned as they are.
func (s *server) followRunning(name string, args, m map[string]any) map[string]any {
	s.t.Helper()
	if name != "sandbox_exec" || args["background"] == true || m["running"] != true {
		return m
	}
	stdout, stderr := m["stdout"].(string), m["stderr"].(string)
	for {
		r := s.ok("sandbox_job", map[string]any{"job": m["job"], "wait_ms": 60000})
		stdout += r["stdout"].(string)
		stderr += r["stderr"].(string)
		if r["state"] != "running" {
			m["stdout"], m["stderr"], m["exit_code"], m["hint"] = stdout, stderr, r["exit_code"], r["hint"]
			delete(m, "running")
			return m
		}
	}
}
