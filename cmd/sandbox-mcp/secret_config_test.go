package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const testSecretValue = "ghp_realvalue_0123456789abcdef"

// TestSecretFlag: --secret takes NAME@HOST[,HOST...] from flags, the
// environment (several joined by ';') and the config file; the value comes
// from the server's variable NAME; it needs --network=allowlist with each
// host allowed, and --env may not carry the name or the value. No message
// quotes the value.
func TestSecretFlag(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"HOME": dir, "GH": testSecretValue, "PYPI": "pypi-token-value-42"}
	net := []string{"--network=allowlist", "--allow-host", "github.com,api.github.com,pypi.example.org"}

	cfg, err := ParseConfig(append(net, "--secret", "GH@github.com,api.github.com", "--secret", "PYPI@pypi.example.org"), envFrom(env))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Secrets) != 2 || cfg.Secrets[0].Name != "GH" || cfg.Secrets[0].Value != testSecretValue ||
		!slices.Equal(cfg.Secrets[0].Hosts, []string{"github.com", "api.github.com"}) || cfg.Secrets[1].Value != "pypi-token-value-42" {
		t.Fatalf("secrets %+v", cfg.Secrets)
	}

	env2 := map[string]string{"HOME": dir, "GH": testSecretValue, "PYPI": "pypi-token-value-42",
		"SANDBOX_MCP_SECRET": "GH@github.com; PYPI@pypi.example.org"}
	if cfg, err := ParseConfig(net, envFrom(env2)); err != nil || len(cfg.Secrets) != 2 {
		t.Fatalf("from the environment: %v %+v", err, cfg.SecretSpecs)
	}
	file := filepath.Join(dir, "c.json")
	os.WriteFile(file, []byte(`{"network": "allowlist", "allow-host": ["github.com"], "secret": ["GH@github.com"]}`), 0o600)
	if cfg, err := ParseConfig([]string{"--config", file}, envFrom(env)); err != nil || len(cfg.Secrets) != 1 {
		t.Fatalf("from the file: %v %+v", err, cfg.SecretSpecs)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--secret", "GH@github.com"}, "only --network=allowlist has"},
		{append(net, "--secret", "GH@gitlab.com"), "gitlab.com, which is not on the --allow-host list"},
		{append(net, "--secret", "MISSING@github.com"), "this server's environment has no MISSING"},
		{append(net, "--secret", "GH@github.com", "--env", "GH=x"), "--env GH: GH is a --secret"},
		{append(net, "--secret", "GH@github.com", "--env", "GH"), "--env GH: GH is a --secret"},
		{append(net, "--secret", "GH@github.com", "--env", "URL=https://x:"+testSecretValue+"@github.com"), "--env URL: its value contains the value of the secret GH"},
		{append(net, "--secret", "GH@github.com", "--secret", "GH@api.github.com"), "given twice"},
		{append(net, "--secret", "GH@github.com", "--env", "SSL_CERT_FILE=/x.pem"), "--env SSL_CERT_FILE: with --secret"},
		{append(net, "--secret", "GH@*.github.com"), "wildcard"},
		{append(net, "--secret", "GH"), "NAME@HOST"},
		{append(net, "--secret", "SANDBOX_MCP_TOKEN@github.com"), "configure this server"},
	} {
		_, err := ParseConfig(tc.args, envFrom(env))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseConfig(%q) = %v, want an error with %q", tc.args, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), testSecretValue) {
			t.Errorf("ParseConfig(%q): the error quotes the secret's value: %v", tc.args, err)
		}
	}
}
