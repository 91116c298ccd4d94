package policy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

func TestDefaultIsValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatal(err)
	}
	p := Default()
	if p.Exec != ExecAllow || p.MaxFileBytes != 8<<20 || p.MaxOutputBytes != 32<<10 || p.MaxWorkspaceBytes != 512<<20 ||
		p.ExecTimeout != time.Minute || p.MaxExecTimeout != 10*time.Minute || p.Memory != 1<<30 || p.CPUs != 1 || p.Pids != 256 || p.Network != NetworkNone {
		t.Fatalf("defaults differ from the documented ones (docs/policy.md, the table): %+v", p)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Policy)
		want string // substring of the error; "" means valid
	}{
		{"allowlist without commands", func(p *Policy) { p.Exec = ExecAllowlist }, "--exec=allowlist needs at least one --allow-cmd"},
		{"allowlist with commands", func(p *Policy) { p.Exec = ExecAllowlist; p.AllowCmds = []string{"ls", "/usr/bin/python3"} }, ""},
		{"relative path entry", func(p *Policy) { p.Exec = ExecAllowlist; p.AllowCmds = []string{"bin/ls"} }, "bare name"},
		{"commands without allowlist", func(p *Policy) { p.AllowCmds = []string{"ls"} }, "use --exec=allowlist"},
		{"unknown exec", func(p *Policy) { p.Exec = "maybe" }, "use allow, allowlist or deny"},
		{"timeout above ceiling", func(p *Policy) { p.ExecTimeout = time.Hour }, "above --max-exec-timeout"},
		{"call wait below a second", func(p *Policy) { p.MaxCallWait = time.Millisecond }, "--max-call-wait"},
		{"no call wait", func(p *Policy) { p.MaxCallWait = 0 }, ""},
		{"zero file cap", func(p *Policy) { p.MaxFileBytes = 0 }, "--max-file-bytes"},
		{"workspace above memory", func(p *Policy) { p.MaxWorkspaceBytes = 2 << 30 }, "raise --memory"},
		{"tiny memory", func(p *Policy) { p.Memory = 1 << 20 }, "--memory"},
		{"no cpus", func(p *Policy) { p.CPUs = 0 }, "--cpus"},
		{"few pids", func(p *Policy) { p.Pids = 3 }, "--pids"},
		{"no jobs", func(p *Policy) { p.MaxExecs = 0 }, "--max-jobs"},
		{"job output below the result cap", func(p *Policy) { p.MaxJobOutputBytes = 1 << 10 }, "--max-job-output-bytes"},
		{"hosts without network", func(p *Policy) { p.AllowHosts = []string{"example.com"} }, "--network=allowlist"},
		{"unknown network", func(p *Policy) { p.Network = "bridge" }, "use none or allowlist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Default()
			tc.edit(&p)
			err := p.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestCheckProgram(t *testing.T) {
	allow := Default()
	allowlist := Default()
	allowlist.Exec = ExecAllowlist
	allowlist.AllowCmds = []string{"ls", "cat", "python3"}
	deny := Default()
	deny.Exec = ExecDeny
	// How the allowlist resolved inside a sandbox (busybox-style: every
	// applet keeps its own name).
	resolved := map[string]string{"/bin/ls": "ls", "/bin/cat": "cat", "/usr/bin/python3": "python3"}

	for _, tc := range []struct {
		name     string
		p        Policy
		argv0    string
		resolved string
		allow    bool
		reason   string
	}{
		{"allow mode runs anything", allow, "curl", "/usr/bin/curl", true, ""},
		{"deny mode refuses", deny, "ls", "/bin/ls", false, "--exec=deny"},
		{"by name", allowlist, "ls", "/bin/ls", true, ""},
		{"by absolute path", allowlist, "/bin/ls", "/bin/ls", true, ""},
		{"through a dot-dot spelling of another program", allowlist, "/usr/bin/../bin/sh", "/bin/sh", false, "resolves to /bin/sh"},
		{"a workspace binary named like an allowed one", allowlist, "./ls", "/workspace/ls", false, "resolves to /workspace/ls"},
		{"not on the list", allowlist, "curl", "/usr/bin/curl", false, `"curl" (/usr/bin/curl) is not on this server's command allowlist (allowed: ls, cat, python3)`},
		{"not found", allowlist, "nope", "", false, `"nope" is not on this server's command allowlist`},
		{"case does not fold", allowlist, "LS", "", false, "not on this server's command allowlist"},
		{"a shell", allowlist, "sh", "/bin/sh", false, "allowed: ls, cat, python3"},
		{"env as a launcher", allowlist, "env", "/usr/bin/env", false, "not on this server's command allowlist"},
		{"busybox itself", allowlist, "busybox", "/bin/busybox", false, "not on this server's command allowlist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.p.CheckProgram(tc.argv0, tc.resolved, resolved)
			if d.Allow != tc.allow {
				t.Fatalf("allow = %v (%s), want %v", d.Allow, d.Reason, tc.allow)
			}
			if !tc.allow {
				if d.Code != errcode.PolicyDenied {
					t.Errorf("code = %s", d.Code)
				}
				if !strings.Contains(d.Reason, tc.reason) {
					t.Errorf("reason %q does not contain %q", d.Reason, tc.reason)
				}
			}
		})
	}
}

func TestCheckArgv(t *testing.T) {
	long := make([]string, MaxArgv+1)
	for i := range long {
		long[i] = "x"
	}
	for _, tc := range []struct {
		argv  []string
		allow bool
	}{
		{[]string{"ls"}, true},
		{[]string{"ls", "-l", ""}, true},
		{nil, false},
		{[]string{}, false},
		{[]string{""}, false},
		{[]string{"ls\x00"}, false},
		{[]string{"ls", "a\x00b"}, false},
		{long[:MaxArgv], true},
		{long, false},
	} {
		if d := CheckArgv(tc.argv); d.Allow != tc.allow || (!d.Allow && d.Code != errcode.InvalidArgument) {
			t.Errorf("CheckArgv(%q) = %v", tc.argv, d)
		}
	}
}

func TestCheckEnv(t *testing.T) {
	env, d := CheckEnv(map[string]string{"B": "2", "A_1": "x=y", "_z": ""})
	if !d.Allow || strings.Join(env, " ") != "A_1=x=y B=2 _z=" {
		t.Fatalf("got %q %v", env, d)
	}
	for _, bad := range []map[string]string{{"1A": "x"}, {"A-B": "x"}, {"": "x"}, {"A B": "x"}, {"A=B": "x"}, {"A": "x\x00y"}} {
		if _, d := CheckEnv(bad); d.Allow || d.Code != errcode.InvalidArgument {
			t.Errorf("CheckEnv(%q) allowed", bad)
		}
	}
}

func TestExecTimeoutFor(t *testing.T) {
	p := Default()
	for _, tc := range []struct {
		ms   int64
		want time.Duration
		code errcode.Code
	}{
		{0, time.Minute, ""},
		{1500, 1500 * time.Millisecond, ""},
		{600000, 10 * time.Minute, ""},
		{600001, 0, errcode.PolicyDenied},
		{-1, 0, errcode.InvalidArgument},
	} {
		got, d := p.ExecTimeoutFor(tc.ms)
		if tc.code == "" && (!d.Allow || got != tc.want) {
			t.Errorf("ExecTimeoutFor(%d) = %s %v, want %s", tc.ms, got, d, tc.want)
		}
		if tc.code != "" && (d.Allow || d.Code != tc.code) {
			t.Errorf("ExecTimeoutFor(%d) = %v, want %s", tc.ms, d, tc.code)
		}
	}
	if _, d := p.ExecTimeoutFor(600001); !strings.Contains(d.Reason, "600000") {
		t.Errorf("reason does not name the ceiling: %s", d.Reason)
	}
}

func TestWorkspacePath(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		code errcode.Code
	}{
		{"", ".", ""},
		{".", ".", ""},
		{"a.txt", "a.txt", ""},
		{"./ok.txt", "./ok.txt", ""},
		{"sub/../ok.txt", "sub/../ok.txt", ""}, // resolved in the sandbox, where symlinks are seen
		{"sub/", "sub/", ""},
		{"/workspace", ".", ""},
		{"/workspace/", ".", ""},
		{"/workspace/a/b", "a/b", ""},
		{"/workspace//a", "a", ""},
		{`..\..\etc\passwd`, `..\..\etc\passwd`, ""}, // a file name on Linux
		{"../../etc/passwd", "", errcode.OutsideWorkspace},
		{"a/../../x", "", errcode.OutsideWorkspace},
		{"./../x", "", errcode.OutsideWorkspace},
		{"..", "", errcode.OutsideWorkspace},
		{"/etc/passwd", "", errcode.OutsideWorkspace},
		{"/workspace/../etc/passwd", "", errcode.OutsideWorkspace},
		{"/workspacex/a", "", errcode.OutsideWorkspace},
		{"/", "", errcode.OutsideWorkspace},
		{"/proc/self/environ", "", errcode.OutsideWorkspace},
		{"ok.txt\x00.png", "", errcode.InvalidArgument},
		{strings.Repeat("a/", MaxPathBytes), "", errcode.InvalidArgument},
		{"\xff\xfe", "", errcode.InvalidArgument},
		{"~", "", errcode.InvalidArgument}, // nothing expands ~: the workspace is /workspace
		{"~/project/a.py", "", errcode.InvalidArgument},
		{"a/~b", "a/~b", ""},
	} {
		got, d := WorkspacePath(tc.in)
		if tc.code == "" {
			if !d.Allow || got != tc.want {
				t.Errorf("WorkspacePath(%q) = %q %v, want %q", tc.in, got, d, tc.want)
			}
		} else if d.Allow || d.Code != tc.code {
			t.Errorf("WorkspacePath(%q) = %q %v, want %s", tc.in, got, d, tc.code)
		} else if strings.HasPrefix(tc.in, "~") && !strings.Contains(d.Reason, "the workspace is /workspace") {
			t.Errorf("WorkspacePath(%q): %q does not say where the workspace is", tc.in, d.Reason)
		}
	}
}

func TestParseMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint32
		ok   bool
	}{
		{"", 0o644, true}, {"0644", 0o644, true}, {"644", 0o644, true}, {"0755", 0o755, true},
		{"0o600", 0o600, true}, {"0", 0, true}, {"0000", 0, true}, {"777", 0o777, true},
		{"4755", 0, false}, {"1777", 0, false}, {"0888", 0, false}, {"rwx", 0, false}, {"-1", 0, false}, {"0644 ", 0, false}, {"000644", 0, false},
	} {
		got, d := ParseMode(tc.in)
		if d.Allow != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("ParseMode(%q) = %o %v", tc.in, got, d)
		}
	}
}

func TestWriteChecks(t *testing.T) {
	p := Default()
	if d := p.CanWrite(); !d.Allow {
		t.Fatal(d)
	}
	p.ReadOnly = true
	if d := p.CanWrite(); d.Allow || d.Code != errcode.ReadOnly || !strings.Contains(d.Reason, "--read-only") {
		t.Fatal(d)
	}
	if d := p.CheckWriteSize(p.MaxFileBytes); !d.Allow {
		t.Fatal(d)
	}
	if d := p.CheckWriteSize(p.MaxFileBytes + 1); d.Allow || d.Code != errcode.TooLarge || !strings.Contains(d.Reason, "append") {
		t.Fatal(d)
	}
}

func TestListEntriesAndRange(t *testing.T) {
	if n, d := ListEntries(0); !d.Allow || n != DefaultListEntries {
		t.Fatal(n, d)
	}
	if n, d := ListEntries(5); !d.Allow || n != 5 {
		t.Fatal(n, d)
	}
	for _, bad := range []int{-1, MaxListEntries + 1} {
		if _, d := ListEntries(bad); d.Allow {
			t.Errorf("ListEntries(%d) allowed", bad)
		}
	}
}

func TestDecisionString(t *testing.T) {
	if s := Deny(errcode.PolicyDenied, "%q is not allowed", "curl").String(); s != `POLICY_DENIED: "curl" is not allowed` {
		t.Fatal(s)
	}
	if Allowed.String() != "allow" {
		t.Fatal(Allowed.String())
	}
}

func TestDecisionErrCarriesCodeAndReason(t *testing.T) {
	if err := Allowed.Err(); err != nil {
		t.Fatalf("Allowed.Err() = %v, want nil", err)
	}
	d := Deny(errcode.PolicyDenied, "%q is not allowed", "curl")
	e, ok := errcode.As(d.Err())
	if !ok || e.Code != errcode.PolicyDenied || e.Message != d.Reason {
		t.Fatalf("Err() = %v, want an *errcode.Error with the decision's code and reason", d.Err())
	}
	if e.Error() != d.String() {
		t.Fatalf("the error reads %q, the decision %q", e.Error(), d.String())
	}
}

func TestArgvAndEnvSizes(t *testing.T) {
	// argv: each item counts with its NUL.
	fits := []string{"sh", "-c", strings.Repeat("<", MaxArgvBytes-len("sh")-len("-c")-3)}
	if d := CheckArgv(fits); !d.Allow {
		t.Fatalf("argv of exactly %d bytes: %v", MaxArgvBytes, d)
	}
	over := []string{"sh", "-c", strings.Repeat("<", MaxArgvBytes-len("sh")-len("-c")-2)}
	d := CheckArgv(over)
	if d.Allow || d.Code != errcode.TooLarge || !strings.Contains(d.Reason, "65537 bytes") || !strings.Contains(d.Reason, "65536") ||
		!strings.Contains(d.Reason, "stdin") || !strings.Contains(d.Reason, "sandbox_write_file") {
		t.Fatalf("argv one byte over: %v", d)
	}
	many := make([]string, MaxArgv)
	for i := range many {
		many[i] = strings.Repeat("x", MaxArgvBytes/MaxArgv) // 64 × 1 KiB, plus the NULs
	}
	if d := CheckArgv(many); d.Allow || d.Code != errcode.TooLarge {
		t.Fatalf("64 items of 1 KiB: %v", d)
	}
	if d := CheckArgv([]string{strings.Repeat("a", MaxPathBytes+1)}); d.Allow || d.Code != errcode.InvalidArgument || !strings.Contains(d.Reason, "argv[0]") {
		t.Fatalf("a program name longer than a path: %v", d)
	}

	// env: NAME=VALUE with its NUL; a 66 KB value is refused.
	if _, d := CheckEnv(map[string]string{"BIG": strings.Repeat("v", 66000)}); d.Allow || d.Code != errcode.TooLarge || !strings.Contains(d.Reason, "66005 bytes") {
		t.Fatalf("a 66 KB value: %v", d)
	}
	if _, d := CheckEnv(map[string]string{"BIG": strings.Repeat("v", MaxEnvBytes-len("BIG=")-1)}); !d.Allow {
		t.Fatalf("env of exactly %d bytes: %v", MaxEnvBytes, d)
	}
	spread := map[string]string{}
	for i := range 1000 {
		spread[fmt.Sprintf("V%d", i)] = strings.Repeat("v", 64)
	}
	if _, d := CheckEnv(spread); d.Allow || d.Code != errcode.TooLarge {
		t.Fatalf("1000 variables of 64 bytes: %v", d)
	}
	// A reason never quotes a caller's huge name whole.
	if _, d := CheckEnv(map[string]string{strings.Repeat("-", 100000): ""}); d.Allow || len(d.Reason) > 200 {
		t.Fatalf("a huge bad name: %d bytes of reason", len(d.Reason))
	}
}

func TestCheckReadRange(t *testing.T) {
	cases := []struct {
		off, limit, boff, blen int64
		bytes                  bool
		code                   errcode.Code
	}{
		{0, 0, 0, 0, false, ""},
		{100, 0, 0, 0, false, ""},
		{1, 50, 0, 0, false, ""},
		{0, 0, 10, 0, true, ""},
		{0, 0, 0, 4096, true, ""},
		{0, 0, 10, 20, true, ""},
		{-1, 0, 0, 0, false, errcode.InvalidArgument},
		{0, -1, 0, 0, false, errcode.InvalidArgument},
		{0, 0, -3, 0, false, errcode.InvalidArgument},
		{0, 0, 0, -3, false, errcode.InvalidArgument},
		{5, 0, 10, 0, false, errcode.InvalidArgument},
		{0, 5, 0, 10, false, errcode.InvalidArgument},
	}
	for _, tc := range cases {
		b, d := CheckReadRange(tc.off, tc.limit, tc.boff, tc.blen)
		if b != tc.bytes || d.Code != tc.code || d.Allow != (tc.code == "") {
			t.Errorf("CheckReadRange(%d, %d, %d, %d) = %v, %+v", tc.off, tc.limit, tc.boff, tc.blen, b, d)
		}
	}
}

func TestCheckPatternAndEdits(t *testing.T) {
	for _, ok := range []string{"", "**/*.py", "src/*.go", "[a-z]*", "a/?/c"} {
		if d := CheckPattern(ok); !d.Allow {
			t.Errorf("CheckPattern(%q) = %+v", ok, d)
		}
	}
	for _, bad := range []string{"src/[a", strings.Repeat("a", MaxPatternBytes+1)} {
		if d := CheckPattern(bad); d.Allow || d.Code != errcode.InvalidArgument {
			t.Errorf("CheckPattern(%.20q) = %+v", bad, d)
		}
	}
	p := Default()
	if d := p.CheckEdits(MaxEdits, 2*p.MaxFileBytes); !d.Allow {
		t.Fatal(d)
	}
	if d := p.CheckEdits(MaxEdits+1, 10); d.Allow || d.Code != errcode.InvalidArgument {
		t.Fatal(d)
	}
	if d := p.CheckEdits(2, 2*p.MaxFileBytes+1); d.Allow || d.Code != errcode.TooLarge {
		t.Fatal(d)
	}
}

func TestCheckRenamableAndEdit(t *testing.T) {
	for _, root := range []string{".", "a/..", "./"} {
		if d := CheckRenamable(root); d.Allow || d.Code != errcode.InvalidArgument {
			t.Errorf("CheckRenamable(%q) = %+v", root, d)
		}
	}
	for _, ok := range []string{"a", "a/b/", "a/../b"} {
		if d := CheckRenamable(ok); !d.Allow {
			t.Errorf("CheckRenamable(%q) = %+v", ok, d)
		}
	}
	p := Default()
	if d := p.CheckEdit(strings.Repeat("x", int(p.MaxFileBytes)), ""); !d.Allow {
		t.Errorf("an old_string of the cap is refused: %+v", d)
	}
	if d := p.CheckEdit("", strings.Repeat("x", int(p.MaxFileBytes)+1)); d.Allow || d.Code != errcode.TooLarge {
		t.Errorf("a new_string past the cap: %+v", d)
	}
	if d := p.CheckEdit("same", "same"); d.Allow || d.Code != errcode.InvalidArgument {
		t.Errorf("an edit that changes nothing: %+v", d)
	}
}
