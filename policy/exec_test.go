package policy

import (
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

func TestOutputSharesKeepTheCap(t *testing.T) {
	for _, tc := range []struct{ limit, a, b, wa, wb int64 }{
		{100, 10, 20, 10, 20},   // both fit
		{100, 10, 500, 10, 90},  // the short one keeps all, the long one the rest
		{100, 500, 30, 70, 30},  // either way round
		{100, 500, 500, 50, 50}, // both long: halves
		{101, 500, 500, 50, 51},
		{100, 0, 500, 0, 100},
	} {
		a, b := OutputShares(tc.limit, tc.a, tc.b)
		if a != tc.wa || b != tc.wb {
			t.Errorf("OutputShares(%d, %d, %d) = %d, %d; want %d, %d", tc.limit, tc.a, tc.b, a, b, tc.wa, tc.wb)
		}
		if a+b > tc.limit || a > tc.a || b > tc.b {
			t.Errorf("OutputShares(%d, %d, %d) = %d, %d: past the cap or the stream", tc.limit, tc.a, tc.b, a, b)
		}
	}
	if h, tl := HeadTail(32 << 10); h != 8<<10 || tl != 24<<10 {
		t.Fatalf("HeadTail(32 KiB) = %d, %d", h, tl)
	}
}

func TestArgvMistakesGetASentenceThatFixesThem(t *testing.T) {
	for _, tc := range []struct {
		argv   []string
		refuse bool
		want   string // in the sentence; "" for no mistake
	}{
		{[]string{"ls -la"}, true, `Split it (["ls", "-la"])`},
		{[]string{"cd", "src"}, true, "cwd"},
		{[]string{"export", "A=1"}, true, "command"},
		{[]string{"source", "venv/bin/activate"}, true, "command"},
		{[]string{"make", "&&", "ls"}, false, "command"},
		{[]string{"echo", "a && b"}, false, "command"},  // an && inside an item, too
		{[]string{"sh", "-c", "make && ls"}, false, ""}, // a shell's line is the shell's
		{[]string{"ls", "-la"}, false, ""},
		{[]string{"find", ".", "-name", "*.go"}, false, ""},
	} {
		got, refuse := ArgvMistake(tc.argv)
		if tc.want == "" {
			if got != "" {
				t.Errorf("%q: unexpected mistake %q", tc.argv, got)
			}
			continue
		}
		if !strings.Contains(got, tc.want) || refuse != tc.refuse {
			t.Errorf("%q: got %q (refuse %v); want a sentence with %q (refuse %v)", tc.argv, got, refuse, tc.want, tc.refuse)
		}
	}
}

func TestCheckCommandAndShell(t *testing.T) {
	if d := CheckCommand(nil, ""); d.Allow || d.Code != errcode.InvalidArgument {
		t.Fatalf("neither argv nor command: %v", d)
	}
	if d := CheckCommand([]string{"ls"}, "ls"); d.Allow || !strings.Contains(d.Reason, "not both") {
		t.Fatalf("both: %v", d)
	}
	if d := CheckCommand(nil, "ls | head"); !d.Allow {
		t.Fatalf("command alone: %v", d)
	}
	if d := CheckCommand(nil, strings.Repeat("x", MaxCommandBytes+1)); d.Code != errcode.TooLarge {
		t.Fatalf("huge command: %v", d)
	}
	p := Default()
	if !p.ShellLines() {
		t.Fatalf("--exec=allow runs no shell lines")
	}
	for cmds, want := range map[string]bool{"ls": false, "ls /usr/bin/python3": false, "ls bash": true, "/bin/sh": true} {
		p.Exec, p.AllowCmds = ExecAllowlist, strings.Fields(cmds)
		if p.ShellLines() != want {
			t.Errorf("allowlist %q: ShellLines %v, want %v", cmds, !want, want)
		}
	}
	p.Exec, p.AllowCmds = ExecAllowlist, []string{"ls"}
	d := p.CheckShell("bash", "/usr/bin/bash", map[string]string{"/usr/bin/ls": "ls"})
	if d.Allow || d.Code != errcode.PolicyDenied || !strings.Contains(d.Reason, "bash") || !strings.Contains(d.Reason, "argv") {
		t.Fatalf("shell off the allowlist: %v", d)
	}
	if d := p.CheckShell("bash", "/usr/bin/bash", map[string]string{"/usr/bin/bash": "bash"}); !d.Allow {
		t.Fatalf("allowlisted shell: %v", d)
	}
	p.Exec, p.AllowCmds = ExecDeny, nil
	if p.ShellLines() {
		t.Errorf("--exec=deny runs shell lines")
	}
	if d := p.CheckShell("bash", "/usr/bin/bash", nil); d.Code != errcode.PolicyDenied {
		t.Fatalf("deny: %v", d)
	}
}

func TestCheckJob(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    Decision
		ok   bool
	}{
		{"list", CheckJob("", 0, "", false, ""), true},
		{"read", CheckJob("3", 1000, "hi", true, "TERM", 0, 5), true},
		{"wait too long", CheckJob("3", MaxJobWait+1, "", false, ""), false},
		{"negative offset", CheckJob("3", 0, "", false, "", -1), false},
		{"odd signal", CheckJob("3", 0, "", false, "STOP"), false},
		{"signal without a job", CheckJob("", 0, "", false, "KILL"), false},
		{"stdin too large", CheckJob("3", 0, strings.Repeat("x", MaxJobStdin+1), false, ""), false},
	} {
		if tc.d.Allow != tc.ok {
			t.Errorf("%s: %v", tc.name, tc.d)
		}
	}
}
