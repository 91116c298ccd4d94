package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

func envFrom(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := ParseConfig(nil, envFrom(map[string]string{"HOME": "/home/u"}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Policy.Exec != policy.ExecAllow || cfg.Policy.MaxFileBytes != 8<<20 || cfg.IdleTimeout != 15*time.Minute {
		t.Fatalf("defaults: %+v", cfg)
	}
	if cfg.StateDir != "/home/u/.local/state/sandbox-mcp" {
		t.Fatalf("state dir %q", cfg.StateDir)
	}
	cfg, _ = ParseConfig(nil, envFrom(map[string]string{"XDG_STATE_HOME": "/xdg"}))
	if cfg.StateDir != "/xdg/sandbox-mcp" {
		t.Fatalf("XDG state dir %q", cfg.StateDir)
	}
}

// TestParseConfigLayers: flags win over the environment, which wins over
// the file; a list set by a higher layer replaces the lower one's.
func TestParseConfigLayers(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.json")
	os.WriteFile(file, []byte(`{"exec": "allowlist", "allow-cmd": ["ls", "cat"], "max-file-bytes": "1MiB", "memory": 536870912, "read-only": true, "exec-timeout": "20s", "env": ["A=from-file"]}`), 0o600)

	cfg, err := ParseConfig([]string{"--config", file}, envFrom(map[string]string{"HOME": dir}))
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Policy
	if p.Exec != policy.ExecAllowlist || !slices.Equal(p.AllowCmds, []string{"ls", "cat"}) || p.MaxFileBytes != 1<<20 ||
		p.Memory != 512<<20 || !p.ReadOnly || p.ExecTimeout != 20*time.Second || !slices.Equal(cfg.Env, []string{"A=from-file"}) {
		t.Fatalf("file layer: %+v %v", p, cfg.Env)
	}

	env := envFrom(map[string]string{"HOME": dir, "SANDBOX_MCP_ALLOW_CMD": "python3", "SANDBOX_MCP_MAX_FILE_BYTES": "2MiB", "SANDBOX_MCP_CONFIG": file, "B": "from-server"})
	cfg, err = ParseConfig([]string{"--allow-cmd", "git", "--allow-cmd", "make,go", "--env", "B"}, env)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Policy.AllowCmds, []string{"git", "make", "go"}) {
		t.Fatalf("flags should replace the environment's list: %v", cfg.Policy.AllowCmds)
	}
	if cfg.Policy.MaxFileBytes != 2<<20 {
		t.Fatalf("environment should win over the file: %d", cfg.Policy.MaxFileBytes)
	}
	if !slices.Equal(cfg.Env, []string{"B=from-server"}) {
		t.Fatalf("--env NAME takes the server's value and replaces the file's list: %v", cfg.Env)
	}
	if !cfg.Policy.ReadOnly || cfg.ConfigFile != file {
		t.Fatalf("file values kept where nothing overrides them: %+v", cfg)
	}
}

func TestParseConfigErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"max-files": 3}`), 0o600)
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--exec", "maybe"}, nil, "allow, allowlist, deny"},
		{[]string{"--exec", "allowlist"}, nil, "needs at least one --allow-cmd"},
		{[]string{"--max-file-bytes", "lots"}, nil, "not a byte count"},
		{[]string{"--env", "1BAD=x"}, nil, "NAME=VALUE"},
		{[]string{"--config", bad}, nil, `unknown key "max-files"`},
		{[]string{"--config", filepath.Join(dir, "missing.json")}, nil, "--config"},
		{nil, map[string]string{"SANDBOX_MCP_PIDS": "many"}, "SANDBOX_MCP_PIDS"},
		{[]string{"stray"}, nil, `unexpected argument "stray"`},
		{[]string{"--memory", "64MiB"}, nil, "raise --memory"},
	} {
		env := map[string]string{"HOME": dir}
		for k, v := range tc.env {
			env[k] = v
		}
		_, err := ParseConfig(tc.args, envFrom(env))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseConfig(%q, %v) = %v, want it to mention %q", tc.args, tc.env, err, tc.want)
		}
	}
}

// TestEnvNeverCarriesServerSecrets: --env refuses the server's own
// variables in any form, and any value holding an HTTP token, so no
// sandbox sees a token; the refusal names the variable, never the value.
func TestEnvNeverCarriesServerSecrets(t *testing.T) {
	tokA, tokB := "token-a-0123456789abcdef", "token-b-fedcba9876543210"
	server := map[string]string{
		"HOME":              t.TempDir(),
		"SANDBOX_MCP_TOKEN": tokA + "," + tokB,
		"COPY":              tokA + "," + tokB,
		"ONE":               tokB,
		"HARMLESS":          "fine",
	}
	for _, tc := range []struct {
		args []string
		want string // "" for accepted
	}{
		{[]string{"--env", "SANDBOX_MCP_TOKEN"}, "SANDBOX_MCP_* configure this server"},
		{[]string{"--env", "SANDBOX_MCP_TOKEN=" + tokA}, "SANDBOX_MCP_* configure this server"},
		{[]string{"--env", "SANDBOX_MCP_IMAGE=busybox"}, "SANDBOX_MCP_* configure this server"},
		{[]string{"--env", "sandbox_mcp_token"}, "SANDBOX_MCP_* configure this server"},
		{[]string{"--env", "COPY"}, "--env COPY: its value contains an HTTP token"},
		{[]string{"--env", "ONE"}, "--env ONE: its value contains an HTTP token"},
		{[]string{"--env", "URL=https://user:" + tokB + "@git.example.com/"}, "--env URL: its value contains an HTTP token"},
		{[]string{"--env", "HARMLESS", "--env", "TOKENISH=token-a"}, ""},
	} {
		args := append([]string{"--http", "127.0.0.1:0"}, tc.args...)
		cfg, err := ParseConfig(args, envFrom(server))
		if tc.want == "" {
			if err != nil {
				t.Errorf("ParseConfig(%q) = %v, want it accepted", tc.args, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseConfig(%q) = %v (env %v), want an error with %q", tc.args, err, cfg.Env, tc.want)
			continue
		}
		if strings.Contains(err.Error(), tokA) || strings.Contains(err.Error(), tokB) {
			t.Errorf("the refusal quotes a token: %v", err)
		}
	}
	// Over stdio there are no tokens, and the server's variables stay out
	// all the same.
	if _, err := ParseConfig([]string{"--env", "SANDBOX_MCP_STATE_DIR=/x"}, envFrom(map[string]string{"HOME": t.TempDir()})); err == nil {
		t.Error("--env SANDBOX_MCP_STATE_DIR=/x accepted over stdio")
	}
}

// TestSeccompProfileFlag: --seccomp-profile is read and checked at start,
// with an error that says what to give; the example profile passes and is
// the engine's default without io_uring.
func TestSeccompProfileFlag(t *testing.T) {
	dir := t.TempDir()
	env := envFrom(map[string]string{"HOME": dir})
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for path, want := range map[string]string{
		filepath.Join(dir, "missing.json"):      "no such file",
		write("yaml.json", "defaultAction: x"):  "is not a JSON object",
		write("list.json", "[1, 2]"):            "is not a JSON object",
		write("empty.json", `{"syscalls": []}`): `has no "defaultAction"`,
	} {
		_, err := ParseConfig([]string{"--seccomp-profile", path}, env)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "examples/seccomp-no-io_uring.json") {
			t.Errorf("--seccomp-profile %s: %v, want %q and the example to use", filepath.Base(path), err, want)
		}
	}

	example := filepath.Join(testenv.RepoRoot(), "examples", "seccomp-no-io_uring.json")
	cfg, err := ParseConfig([]string{"--seccomp-profile", example}, env)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.SeccompProfileFile != example || !strings.HasPrefix(cfg.SeccompProfile, `{"defaultAction":"SCMP_ACT_ERRNO",`) ||
		strings.Contains(cfg.SeccompProfile, "io_uring") || !strings.Contains(cfg.SeccompProfile, `"openat2"`) {
		t.Fatalf("the example profile: file %q, profile %.120q", cfg.SeccompProfileFile, cfg.SeccompProfile)
	}
	if cfg, _ := ParseConfig(nil, env); cfg.SeccompProfile != "" {
		t.Fatal("a profile without --seccomp-profile")
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1048576": 1 << 20, "512KiB": 512 << 10, "8MiB": 8 << 20, "1GiB": 1 << 30, "1g": 1 << 30, "64m": 64 << 20, "2 MB": 2 << 20} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "1.5GiB", "lots", "1PiB", "99999999999999999999"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) accepted", bad)
		}
	}
}

func TestKnownEscapes(t *testing.T) {
	for _, tc := range []struct {
		engine, runc string
		want         []string
	}{
		{"20.10.24+dfsg1", "1.1.5+ds1", []string{"CVE-2024-29018", "CVE-2025-54388", "CVE-2024-21626", "CVE-2025-31133"}},
		{"28.5.2", "1.3.3", nil},
		{"25.0.5", "1.2.8", []string{"CVE-2025-54388"}},
		{"23.0.11", "1.1.12", []string{"CVE-2025-54388", "CVE-2025-31133"}},
		{"26.1.0", "1.3.2", []string{"CVE-2025-54388", "CVE-2025-31133"}},
		{"garbage", "", nil},
	} {
		got := strings.Join(knownEscapes(tc.engine, tc.runc), "\n")
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("knownEscapes(%s, %s) lacks %s:\n%s", tc.engine, tc.runc, w, got)
			}
		}
		if len(tc.want) == 0 && got != "" {
			t.Errorf("knownEscapes(%s, %s) = %s, want none", tc.engine, tc.runc, got)
		}
		if got != "" && !strings.Contains(got, "patch without changing the version") {
			t.Errorf("warnings must say distributions patch: %s", got)
		}
	}
}

// TestMaxCallWaitFlag: --max-call-wait is 50s by default and is set like
// every flag, from the file, the environment or the command line; below a
// second (but 0) it is refused.
func TestMaxCallWaitFlag(t *testing.T) {
	dir := t.TempDir()
	cfg, err := ParseConfig(nil, envFrom(map[string]string{"HOME": dir}))
	if err != nil || cfg.Policy.MaxCallWait != 50*time.Second {
		t.Fatalf("default: %s %v", cfg.Policy.MaxCallWait, err)
	}
	file := filepath.Join(dir, "c.json")
	os.WriteFile(file, []byte(`{"max-call-wait": "20s"}`), 0o600)
	if cfg, err = ParseConfig([]string{"--config", file}, envFrom(map[string]string{"HOME": dir})); err != nil || cfg.Policy.MaxCallWait != 20*time.Second {
		t.Fatalf("from the file: %s %v", cfg.Policy.MaxCallWait, err)
	}
	if cfg, err = ParseConfig(nil, envFrom(map[string]string{"HOME": dir, "SANDBOX_MCP_MAX_CALL_WAIT": "0"})); err != nil || cfg.Policy.MaxCallWait != 0 {
		t.Fatalf("from the environment: %s %v", cfg.Policy.MaxCallWait, err)
	}
	if cfg, err = ParseConfig([]string{"--max-call-wait", "2m"}, envFrom(map[string]string{"HOME": dir})); err != nil || cfg.Policy.MaxCallWait != 2*time.Minute {
		t.Fatalf("from the flag: %s %v", cfg.Policy.MaxCallWait, err)
	}
	if _, err = ParseConfig([]string{"--max-call-wait", "10ms"}, envFrom(map[string]string{"HOME": dir})); err == nil || !strings.Contains(err.Error(), "--max-call-wait") {
		t.Fatalf("10ms: %v", err)
	}
}

// TestMaxImagePixelsFlag: --max-image-pixels is 40 megapixels by default
// and is set like every flag, from the file, the environment or the
// command line; 0 is refused.
func TestMaxImagePixelsFlag(t *testing.T) {
	dir := t.TempDir()
	cfg, err := ParseConfig(nil, envFrom(map[string]string{"HOME": dir}))
	if err != nil || cfg.Policy.MaxImagePixels != 40_000_000 {
		t.Fatalf("default: %d %v", cfg.Policy.MaxImagePixels, err)
	}
	file := filepath.Join(dir, "c.json")
	os.WriteFile(file, []byte(`{"max-image-pixels": 1000000}`), 0o600)
	if cfg, err = ParseConfig([]string{"--config", file}, envFrom(map[string]string{"HOME": dir})); err != nil || cfg.Policy.MaxImagePixels != 1_000_000 {
		t.Fatalf("from the file: %d %v", cfg.Policy.MaxImagePixels, err)
	}
	if cfg, err = ParseConfig(nil, envFrom(map[string]string{"HOME": dir, "SANDBOX_MCP_MAX_IMAGE_PIXELS": "2000000"})); err != nil || cfg.Policy.MaxImagePixels != 2_000_000 {
		t.Fatalf("from the environment: %d %v", cfg.Policy.MaxImagePixels, err)
	}
	if cfg, err = ParseConfig([]string{"--max-image-pixels", "3000000"}, envFrom(map[string]string{"HOME": dir})); err != nil || cfg.Policy.MaxImagePixels != 3_000_000 {
		t.Fatalf("from the flag: %d %v", cfg.Policy.MaxImagePixels, err)
	}
	if _, err = ParseConfig([]string{"--max-image-pixels", "0"}, envFrom(map[string]string{"HOME": dir})); err == nil || !strings.Contains(err.Error(), "--max-image-pixels") {
		t.Fatalf("0: %v", err)
	}
}
