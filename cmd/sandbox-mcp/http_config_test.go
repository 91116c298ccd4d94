package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/cmd/sandbox-mcp/internal/httpguard"
	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

func TestParseConfigHTTP(t *testing.T) {
	cfg, err := ParseConfig(nil, envFrom(map[string]string{"HOME": "/home/u"}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HTTP.Addr != "" || cfg.HTTP.MaxSandboxes != DefaultMaxSandboxes || len(cfg.HTTP.Tokens) != 0 || cfg.AuditLog != "" {
		t.Fatalf("defaults: %+v %q", cfg.HTTP, cfg.AuditLog)
	}

	env := envFrom(map[string]string{"HOME": "/home/u", "SANDBOX_MCP_TOKEN": "env-token-0123456789,env-token-abcdefghij"})
	cfg, err = ParseConfig([]string{"--http", "127.0.0.1:8080", "--allow-origin", "https://a.example,https://b.example:8443",
		"--http-allow-host", "mcp.example.com", "--max-sessions", "4", "--audit-log", "/var/log/sbx.jsonl"}, env)
	if err != nil {
		t.Fatal(err)
	}
	h := cfg.HTTP
	if h.Addr != "127.0.0.1:8080" || h.MaxSandboxes != 4 || cfg.AuditLog != "/var/log/sbx.jsonl" ||
		!slices.Equal(h.Tokens, []string{"env-token-0123456789", "env-token-abcdefghij"}) ||
		!slices.Equal(h.AllowOrigins, []string{"https://a.example", "https://b.example:8443"}) ||
		!slices.Equal(h.AllowHosts, []string{"mcp.example.com"}) {
		t.Fatalf("HTTP config: %+v", h)
	}
	// Flags replace the environment's tokens; --token repeats.
	cfg, err = ParseConfig([]string{"--token", "flag-token-0123456789", "--token", "flag-token-abcdefghij"}, env)
	if err != nil || !slices.Equal(cfg.HTTP.Tokens, []string{"flag-token-0123456789", "flag-token-abcdefghij"}) {
		t.Fatalf("--token: %v %v", cfg.HTTP.Tokens, err)
	}
}

func TestParseConfigHTTPErrors(t *testing.T) {
	const short = "short-secret"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--token", short}, "at least 16"},
		{[]string{"--token", "a-long-enough-token with-space"}, "printable ASCII"},
		{[]string{"--token", "good-token-0123456789," + short}, "token 2 of 2"},
		{[]string{"--allow-origin", "null"}, "any web page"},
		{[]string{"--allow-origin", "*"}, "any web page"},
		{[]string{"--allow-origin", "tools.example.com"}, "scheme://host"},
		{[]string{"--allow-origin", "https://tools.example.com/app"}, "scheme://host"},
		{[]string{"--allow-origin", "ftp://tools.example.com"}, "scheme://host"},
		{[]string{"--http-allow-host", "https://mcp.example.com"}, "host name"},
		{[]string{"--max-sessions", "0"}, "--max-sandboxes must be at least 1"},
		{[]string{"--http", "8080"}, "want host:port"},
	} {
		_, err := ParseConfig(tc.args, envFrom(map[string]string{"HOME": t.TempDir()}))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseConfig(%q) = %v, want it to mention %q", tc.args, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), short) || strings.Contains(err.Error(), "with-space") {
			t.Errorf("the error quotes a token: %v", err)
		}
	}
	// A token handed to the sandboxes through --env is refused.
	_, err := ParseConfig([]string{"--env", "SANDBOX_MCP_TOKEN"}, envFrom(map[string]string{"HOME": t.TempDir(), "SANDBOX_MCP_TOKEN": "env-token-0123456789"}))
	if err == nil || !strings.Contains(err.Error(), "--env SANDBOX_MCP_TOKEN") || strings.Contains(err.Error(), "env-token-0123456789") {
		t.Errorf("a token passed to sandboxes: %v", err)
	}
	// Help never shows a token, even one set in the environment.
	var out bytes.Buffer
	usage(&out, envFrom(map[string]string{"SANDBOX_MCP_TOKEN": "env-token-0123456789"}))
	if strings.Contains(out.String(), "env-token-0123456789") || !strings.Contains(out.String(), "--http-allow-host") {
		t.Errorf("help:\n%s", out.String())
	}
}

// TestHTTPExamples keeps the HTTP client examples in line with the server:
// the /mcp path, a bearer token header, and the token's variable name.
func TestHTTPExamples(t *testing.T) {
	root := filepath.Join(testenv.RepoRoot(), "examples")
	b, err := os.ReadFile(filepath.Join(root, "vscode-mcp-http.json"))
	if err != nil {
		t.Fatal(err)
	}
	var vs struct {
		Servers map[string]struct {
			Type    string
			URL     string
			Headers map[string]string
		}
	}
	if err := json.Unmarshal(b, &vs); err != nil {
		t.Fatal(err)
	}
	sb := vs.Servers["sandbox"]
	if sb.Type != "http" || !strings.HasSuffix(sb.URL, httpguard.Path) || !strings.HasPrefix(sb.Headers["Authorization"], "Bearer ${input:") {
		t.Errorf("vscode-mcp-http.json: %+v", sb)
	}
	for name, wants := range map[string][]string{
		"codex-http.toml": {`url = "https://mcp.example.com` + httpguard.Path + `"`, `bearer_token_env_var = "` + EnvVar("token") + `"`},
		// The token stays out of ~/.claude.json: the project's .mcp.json
		// names the variable and Claude Code fills it in at start.
		"claude-code-http.sh":  {"add-json --scope project", `"type":"http"`, httpguard.Path + `"`, `"Authorization":"Bearer ${` + EnvVar("token") + `}"`},
		"claude-code-mcp.json": {`"type": "http"`, httpguard.Path + `"`, `"Authorization": "Bearer ${` + EnvVar("token") + `}"`},
	} {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range wants {
			if !strings.Contains(string(b), w) {
				t.Errorf("%s lacks %q", name, w)
			}
		}
	}
}

func TestPerCallerQuotas(t *testing.T) {
	two := "SANDBOX_MCP_TOKEN=" + "tok-one-0123456789abc,tok-two-0123456789abc"
	for _, tc := range []struct {
		env             []string
		args            []string
		sessions, calls int
	}{
		// Several callers: a quarter each, and twice that in calls.
		{[]string{two}, nil, 8, 16},
		{[]string{two}, []string{"--max-sessions", "3"}, 1, 2},
		{[]string{two}, []string{"--max-sessions", "10"}, 2, 4},
		// One caller (or none, on loopback) may use every place.
		{nil, nil, 32, 64},
		{[]string{"SANDBOX_MCP_TOKEN=tok-one-0123456789abc"}, nil, 32, 64},
		{[]string{"SANDBOX_MCP_TOKEN=tok-one-0123456789abc,tok-one-0123456789abc"}, nil, 32, 64},
		// Set: as set, by flag, environment or config file.
		{[]string{two}, []string{"--max-sessions-per-caller", "5"}, 5, 10},
		{[]string{two}, []string{"--max-calls-per-caller", "3"}, 8, 3},
		{[]string{two, "SANDBOX_MCP_MAX_SESSIONS_PER_CALLER=4", "SANDBOX_MCP_MAX_CALLS_PER_CALLER=7"}, nil, 4, 7},
	} {
		env := map[string]string{"HOME": t.TempDir()}
		for _, kv := range tc.env {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		cfg, err := ParseConfig(tc.args, envFrom(env))
		if err != nil {
			t.Fatalf("%v %v: %v", tc.env, tc.args, err)
		}
		if s, c := cfg.HTTP.SandboxesPerCaller(), cfg.HTTP.CallsPerCaller(); s != tc.sessions || c != tc.calls {
			t.Errorf("%v %v: %d sessions and %d calls per caller, want %d and %d", tc.env, tc.args, s, c, tc.sessions, tc.calls)
		}
	}

	file := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(file, []byte(`{"max-sessions-per-caller": 3, "max-calls-per-caller": 9}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseConfig([]string{"--config", file}, envFrom(map[string]string{"HOME": t.TempDir()}))
	if err != nil || cfg.HTTP.SandboxesPerCaller() != 3 || cfg.HTTP.CallsPerCaller() != 9 {
		t.Fatalf("from the config file: %d %d %v", cfg.HTTP.SandboxesPerCaller(), cfg.HTTP.CallsPerCaller(), err)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-sessions-per-caller", "-1"}, "--max-sandboxes-per-caller must not be negative"},
		{[]string{"--max-sessions", "4", "--max-sessions-per-caller", "5"}, "--max-sandboxes-per-caller 5 is above --max-sandboxes 4"},
		{[]string{"--max-calls-per-caller", "-2"}, "--max-calls-per-caller must not be negative"},
	} {
		if _, err := ParseConfig(tc.args, envFrom(map[string]string{"HOME": t.TempDir()})); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseConfig(%q) = %v, want it to mention %q", tc.args, err, tc.want)
		}
	}
}
