package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
)

// TestFlagGroups: every flag of the server is in exactly one group of
// `sandbox-mcp --help`, or is a deprecated name; the help lists the groups
// in order, each flag once, and no deprecated name.
func TestFlagGroups(t *testing.T) {
	env := envFrom(map[string]string{"HOME": t.TempDir()})
	cfg := defaultConfig(env)
	f := newFlagSet(&cfg, env)
	for _, p := range ungroupedFlags(f.fs) {
		t.Error(p)
	}
	// The check itself: a new flag in no group is named.
	f.fs.Bool("a-new-flag", false, "")
	if p := ungroupedFlags(f.fs); len(p) != 1 || !strings.Contains(p[0], "--a-new-flag is in no group") || !strings.Contains(p[0], "usage.go") {
		t.Errorf("a flag in no group is not reported clearly: %q", p)
	}
	for old, now := range deprecatedFlags {
		if f.fs.Lookup(old) == nil || f.fs.Lookup(now) == nil {
			t.Errorf("deprecated --%s (now --%s): both must still be flags", old, now)
		}
	}

	var out bytes.Buffer
	if rc := run(context.Background(), []string{"--help"}, strings.NewReader(""), &out, io.Discard, env); rc != 0 {
		t.Fatalf("--help exited %d", rc)
	}
	help := out.String()
	last := -1
	for _, g := range flagGroups {
		i := strings.Index(help, "\n"+g.title+":\n")
		if i < 0 || i < last {
			t.Errorf("heading %q missing or out of order in --help", g.title)
		}
		last = i
	}
	f.fs.VisitAll(func(fl *flag.Flag) {
		n := strings.Count(help, "\n  --"+fl.Name+" ") + strings.Count(help, "\n  --"+fl.Name+"\n")
		_, deprecated := deprecatedFlags[fl.Name]
		switch {
		case fl.Name == "a-new-flag":
		case deprecated && n != 0:
			t.Errorf("deprecated --%s is listed in --help", fl.Name)
		case !deprecated && n != 1:
			t.Errorf("--%s is listed %d times in --help", fl.Name, n)
		}
	})
	// docs/policy.md documents every flag.
	policyDoc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "policy.md"))
	if err != nil {
		t.Fatal(err)
	}
	f.fs.VisitAll(func(fl *flag.Flag) {
		if _, deprecated := deprecatedFlags[fl.Name]; !deprecated && fl.Name != "a-new-flag" && !strings.Contains(string(policyDoc), "`--"+fl.Name+"`") {
			t.Errorf("docs/policy.md does not document --%s", fl.Name)
		}
	})
	// Deprecated names are still accepted.
	if cfg, err := ParseConfig([]string{"--max-execs", "3"}, env); err != nil || cfg.Policy.MaxExecs != 3 {
		t.Errorf("--max-execs 3: %d %v", cfg.Policy.MaxExecs, err)
	}
	// -h after other flags is help too, not an error.
	out.Reset()
	if rc := run(context.Background(), []string{"--exec", "deny", "-h"}, strings.NewReader(""), &out, io.Discard, env); rc != 0 || !strings.Contains(out.String(), "\nNetwork:\n") {
		t.Errorf("--exec deny -h: exit %d\n%s", rc, out.String())
	}
}

// TestDoctorHelp: `sandbox-mcp doctor --help` prints doctor's help and the
// flags, and exits 0 without checking anything.
func TestDoctorHelp(t *testing.T) {
	env := envFrom(map[string]string{"HOME": t.TempDir()})
	for _, args := range [][]string{{"doctor", "--help"}, {"doctor", "-h"}, {"doctor", "help"}, {"doctor", "--backend", "kubernetes", "-help"}} {
		var out bytes.Buffer
		rc := run(context.Background(), args, strings.NewReader(""), &out, io.Discard, env)
		s := out.String()
		if rc != 0 || !strings.HasPrefix(s, "Usage: sandbox-mcp doctor") || !strings.Contains(s, "\nKubernetes:\n  --backend") ||
			strings.Contains(s, "FAIL") || strings.Contains(s, "not ready") {
			t.Errorf("%q: exit %d\n%s", args, rc, s)
		}
	}
}

// TestExampleFiles checks every file in examples/: JSON and TOML parse
// (JSON without a repeated key), every sandbox-mcp command line and
// SANDBOX_MCP_* variable in a client config is one the server accepts, the
// Claude Desktop examples let a command run less than that client waits
// (about 60 s), and Codex waits longer than the server lets a command run.
// A new file without a check fails here.
func TestExampleFiles(t *testing.T) {
	root := filepath.Join(testenv.RepoRoot(), "examples")
	home := t.TempDir()
	// checkServer parses one server command line (args after the binary,
	// env the config's environment block).
	checkServer := func(name string, args []string, envBlock map[string]string) Config {
		t.Helper()
		m := map[string]string{"HOME": home}
		for k, v := range envBlock {
			if !strings.HasPrefix(k, EnvPrefix) {
				continue
			}
			m[k] = v
		}
		cfg, err := ParseConfig(args, envFrom(m))
		if err != nil {
			t.Errorf("%s: sandbox-mcp %q refuses: %v", name, args, err)
		}
		return cfg
	}
	checked := map[string]bool{}
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		name := e.Name()
		path := filepath.Join(root, name)
		b, _ := os.ReadFile(path)
		switch {
		case e.IsDir() && name == "toolchain":
			// TestToolchainImage (image_e2e_test.go) builds its Dockerfile.
			checked[name] = true
		case name == "seccomp-no-io_uring.json":
			if _, err := loadSeccompProfile(path); err != nil {
				t.Errorf("%s: %v", name, err)
			}
			checked[name] = true
		case name == "config.json":
			if err := strictJSON(b, new(map[string]any)); err != nil {
				t.Errorf("%s: %v", name, err)
			}
			if _, err := ParseConfig([]string{"--config", path}, envFrom(map[string]string{"HOME": home})); err != nil {
				t.Errorf("%s: %v", name, err)
			}
			checked[name] = true
		case strings.HasSuffix(name, ".json"):
			var v struct {
				MCPServers map[string]clientServer `json:"mcpServers"`
				Servers    map[string]clientServer `json:"servers"`
			}
			if err := strictJSON(b, &v); err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			servers := v.MCPServers
			if servers == nil {
				servers = v.Servers
			}
			if len(servers) == 0 {
				t.Errorf("%s: no mcpServers or servers", name)
			}
			for sname, s := range servers {
				switch {
				case s.URL != "":
					if !strings.HasSuffix(s.URL, "/mcp") || !strings.Contains(s.Headers["Authorization"], "Bearer ${") {
						t.Errorf("%s: %s: an HTTP server needs the /mcp URL and a bearer token from a variable, not written in the file: %+v", name, sname, s)
					}
				case s.Command != "":
					args, ok := exampleArgs(s.Command, s.Args)
					if !ok {
						t.Errorf("%s: %s: no sandbox-mcp in %s %q", name, sname, s.Command, s.Args)
						continue
					}
					cfg := checkServer(name, args, s.Env)
					if strings.HasPrefix(name, "claude-config") && (cfg.Policy.ExecTimeout >= time.Minute || cfg.Policy.MaxCallWait == 0 || cfg.Policy.MaxCallWait >= time.Minute) {
						t.Errorf("%s: Claude Desktop waits about 60 s for a call: --exec-timeout %s and --max-call-wait %s must stay under it", name, cfg.Policy.ExecTimeout, cfg.Policy.MaxCallWait)
					}
				default:
					t.Errorf("%s: %s has neither command nor url", name, sname)
				}
			}
			checked[name] = true
		case strings.HasSuffix(name, ".toml"):
			tables, err := parseTOMLSubset(string(b))
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			srv, ok := tables["mcp_servers.sandbox"]
			if !ok {
				t.Errorf("%s: no [mcp_servers.sandbox]", name)
				continue
			}
			if cmd, ok := srv["command"].(string); ok {
				args, _ := srv["args"].([]string)
				if a, ok := exampleArgs(cmd, args); ok {
					checkServer(name, a, nil)
				} else {
					t.Errorf("%s: command %q is not sandbox-mcp", name, cmd)
				}
			} else if _, ok := srv["url"].(string); !ok {
				t.Errorf("%s: neither command nor url", name)
			}
			// Codex gives up on a tool call after tool_timeout_sec.
			sec, _ := srv["tool_timeout_sec"].(int)
			if time.Duration(sec)*time.Second <= defaultConfig(envFrom(nil)).Policy.MaxExecTimeout {
				t.Errorf("%s: tool_timeout_sec %d is not above --max-exec-timeout's default", name, sec)
			}
			checked[name] = true
		case strings.HasSuffix(name, ".sh"):
			if out, err := exec.Command("sh", "-n", path).CombinedOutput(); err != nil {
				t.Errorf("%s: sh -n: %v %s", name, err, out)
			}
			// `claude mcp add NAME -- BIN ARGS` or `claude mcp add-json ... 'JSON'`.
			if m := regexp.MustCompile(`(?m)^claude mcp add \S+ -- (\S+)(.*)$`).FindStringSubmatch(string(b)); m != nil {
				args, ok := exampleArgs(m[1], strings.Fields(m[2]))
				if !ok {
					t.Errorf("%s: %s is not sandbox-mcp", name, m[1])
				}
				checkServer(name, args, nil)
			} else if m := regexp.MustCompile(`'(\{.*\})'`).FindStringSubmatch(string(b)); m != nil {
				var s clientServer
				if err := strictJSON([]byte(m[1]), &s); err != nil || s.URL == "" || !strings.Contains(s.Headers["Authorization"], "Bearer ${") {
					t.Errorf("%s: the server's JSON: %v %+v", name, err, s)
				}
			} else {
				t.Errorf("%s: no `claude mcp add` line", name)
			}
			checked[name] = true
		}
		if !checked[name] {
			t.Errorf("examples/%s has no check in TestExampleFiles: add one", name)
		}
	}
	if !checked["cursor-mcp.json"] {
		t.Error("examples/cursor-mcp.json is missing")
	}
}

// clientServer is one server in a client's JSON config (Claude, Cursor, VS
// Code).
type clientServer struct {
	Type    string            `json:"type"`
	Command string            `json:"command"`
	Args    []string          `json:"args"`
	Env     map[string]string `json:"env"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
}

// exampleArgs returns the sandbox-mcp arguments of a command line, which may
// go through ssh.
func exampleArgs(cmd string, args []string) ([]string, bool) {
	all := append([]string{cmd}, args...)
	for i, a := range all {
		if filepath.Base(a) == "sandbox-mcp" {
			return all[i+1:], true
		}
	}
	return nil, false
}

// strictJSON decodes b into v, refusing a repeated key in any object (which
// clients resolve differently) and trailing data.
func strictJSON(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	var walk func() error
	walk = func() error {
		tok, err := d.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			keys := map[string]bool{}
			for d.More() {
				k, err := d.Token()
				if err != nil {
					return err
				}
				if keys[k.(string)] {
					return fmt.Errorf("key %q repeated", k)
				}
				keys[k.(string)] = true
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = d.Token()
			return err
		case json.Delim('['):
			for d.More() {
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = d.Token()
			return err
		}
		return nil
	}
	if err := walk(); err != nil {
		return err
	}
	if _, err := d.Token(); err != io.EOF {
		return errors.New("data after the JSON value")
	}
	return json.Unmarshal(b, v)
}

// parseTOMLSubset parses the TOML the examples use, and refuses anything
// else: comments, [tables], and key = value with a basic string, an
// integer, a boolean or an array of basic strings. It returns each table's
// keys.
func parseTOMLSubset(s string) (map[string]map[string]any, error) {
	tables := map[string]map[string]any{"": {}}
	cur := ""
	keyRe := regexp.MustCompile(`^([A-Za-z0-9_-]+)\s*=\s*(.+)$`)
	for n, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "[") {
			if !strings.HasSuffix(line, "]") || strings.HasPrefix(line, "[[") {
				return nil, fmt.Errorf("line %d: %q is not a table header", n+1, line)
			}
			cur = strings.TrimSpace(line[1 : len(line)-1])
			if _, dup := tables[cur]; dup {
				return nil, fmt.Errorf("line %d: table [%s] repeated", n+1, cur)
			}
			tables[cur] = map[string]any{}
			continue
		}
		m := keyRe.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("line %d: %q is not key = value", n+1, line)
		}
		if _, dup := tables[cur][m[1]]; dup {
			return nil, fmt.Errorf("line %d: key %s repeated", n+1, m[1])
		}
		val, err := tomlValue(m[2])
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", n+1, err)
		}
		tables[cur][m[1]] = val
	}
	return tables, nil
}

func tomlValue(v string) (any, error) {
	switch {
	case strings.HasPrefix(v, `"`):
		var s string
		err := json.Unmarshal([]byte(v), &s) // basic strings escape as JSON does
		return s, err
	case strings.HasPrefix(v, "["):
		var a []string
		err := json.Unmarshal([]byte(v), &a)
		return a, err
	case v == "true" || v == "false":
		return v == "true", nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return nil, fmt.Errorf("%q is not a value this check knows", v)
	}
	return n, nil
}
