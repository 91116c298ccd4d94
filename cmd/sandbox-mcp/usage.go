package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// flagGroups is the map `sandbox-mcp --help` prints: every flag belongs to
// exactly one group (TestFlagGroups checks), listed in this order. A new
// flag goes into the group an operator would look for it in.
var flagGroups = []struct {
	title string
	flags []string
}{
	{"Sandbox and policy", []string{
		"config", "exec", "allow-cmd", "read-only", "image", "agent-bin", "agent-mount", "env", "workspace-from",
		"exec-timeout", "max-exec-timeout", "max-call-wait", "max-file-bytes", "max-output-bytes", "max-image-pixels",
		"max-job-output-bytes", "max-workspace-bytes", "memory", "cpus", "pids", "max-jobs",
		"idle-timeout", "max-sandbox-lifetime", "lease", "end-handles-at-stop", "warm", "runtime", "seccomp-profile",
	}},
	{"Network", []string{"network", "allow-host", "allow-private-networks", "network-pool", "network-approval", "network-approval-wait", "network-approval-caller-scope"}},
	{"Secrets", []string{"secret"}},
	{"HTTP serving", []string{"http", "token", "http-allow-host", "allow-origin", "default-sandbox", "preview-listen", "preview-ttl"}},
	{"Limits for many callers", []string{
		"max-sandboxes", "max-sandboxes-per-caller", "max-calls-per-caller",
		"max-inflight-bytes", "max-session-inflight-bytes",
	}},
	{"Snapshots", []string{
		"state-dir", "state-slot", "snapshot-max-count", "snapshot-max-bytes", "snapshot-max-age",
		"snapshot-max-count-per-caller", "snapshot-max-bytes-per-caller",
	}},
	{"Kubernetes", []string{
		"backend", "kubeconfig", "namespace", "agent-image", "pull-policy", "runtime-class",
		"seccomp-localhost-profile", "proxy-listen", "proxy-advertise", "replica-key-file",
	}},
	{"Diagnostics", []string{"log-level", "audit-log"}},
}

// deprecatedFlags are old names still accepted (in flags, the environment
// and the config file) but not listed: each maps to the name that replaced
// it.
var deprecatedFlags = map[string]string{
	"max-execs":               "max-jobs",
	"max-sessions":            "max-sandboxes",
	"max-sessions-per-caller": "max-sandboxes-per-caller",
}

// usage prints the server's help: the commands, then every flag by group.
func usage(w io.Writer, getenv func(string) string) {
	fmt.Fprintf(w, `sandbox-mcp %s: an MCP server that runs code in one hardened Docker container per session.

Usage:
  sandbox-mcp [flags]         serve MCP over stdio
  sandbox-mcp --http ADDR     serve streamable HTTP at http://ADDR/mcp (many sessions; see --token)
  sandbox-mcp doctor [flags]  check the engine, the image and the agent, and say what to fix
  sandbox-mcp prepare [flags] prepare what sandboxes need (the server does it in the background), then exit
  sandbox-mcp snapshot list|export|rm ...   manage stored snapshots (sandbox-mcp snapshot -h)
  sandbox-mcp audit digest [flags] < ARGS    the audit log's digest of a tool call's arguments (JSON on stdin)
  sandbox-mcp image           print the default image's tag, to build your own image FROM it
  sandbox-mcp uninstall       remove what it made: images, sandboxes, networks, state, firewall table (-h)
  sandbox-mcp version         print the version

Every flag can also be set as %s<NAME> (e.g. %s) or as a key of the
JSON file --config names. Flags win over the environment, which wins over the file.
`, buildVersion(), EnvPrefix, EnvVar("max-file-bytes"))
	printFlags(w, getenv)
}

// doctorUsage is `sandbox-mcp doctor --help`.
func doctorUsage(w io.Writer, getenv func(string) string) {
	fmt.Fprintf(w, `Usage: sandbox-mcp doctor [flags]

Checks what the server needs with the configuration the flags give, and says
what to fix: with the Docker backend the agent binary, the engine and its
versions, the image, internal networks, and a command in a real sandbox; with
--backend kubernetes the API server, the namespace, each permission the server
uses and a real sandbox pod. Give it the flags you give the server (the
environment and --config are read the same way). It exits 0 when ready, 1 when
a check failed.
`)
	printFlags(w, getenv)
}

// printFlags prints every listed flag under its group's heading.
func printFlags(w io.Writer, getenv func(string) string) {
	cfg := defaultConfig(getenv)
	f := newFlagSet(&cfg, getenv)
	for _, g := range flagGroups {
		fmt.Fprintf(w, "\n%s:\n", g.title)
		for _, name := range g.flags {
			fl := f.fs.Lookup(name)
			if fl == nil {
				continue // TestFlagGroups names it
			}
			typ, use := flag.UnquoteUsage(fl)
			fmt.Fprintf(w, "  --%s", fl.Name)
			if typ != "" {
				fmt.Fprintf(w, " %s", typ)
			}
			fmt.Fprintf(w, "\n    \t%s", use)
			if fl.DefValue != "" && fl.DefValue != "false" && fl.DefValue != "0" {
				fmt.Fprintf(w, " (default %s)", fl.DefValue)
			}
			fmt.Fprintf(w, " [%s]\n", EnvVar(fl.Name))
		}
	}
}

// ungroupedFlags returns the problems with flagGroups against the flags fs
// defines: a flag in no group or in two, a listed name that is no flag, a
// deprecated name that is listed.
func ungroupedFlags(fs *flag.FlagSet) []string {
	seen := map[string]string{}
	var problems []string
	for _, g := range flagGroups {
		for _, name := range g.flags {
			if fs.Lookup(name) == nil {
				problems = append(problems, fmt.Sprintf("flagGroups (usage.go) lists --%s under %q, but there is no such flag", name, g.title))
			}
			if _, ok := deprecatedFlags[name]; ok {
				problems = append(problems, fmt.Sprintf("--%s is deprecated (deprecatedFlags) and must not be listed under %q", name, g.title))
			}
			if prev, ok := seen[name]; ok {
				problems = append(problems, fmt.Sprintf("--%s is listed under both %q and %q in flagGroups (usage.go): keep one", name, prev, g.title))
			}
			seen[name] = g.title
		}
	}
	fs.VisitAll(func(fl *flag.Flag) {
		if _, ok := seen[fl.Name]; ok {
			return
		}
		if _, ok := deprecatedFlags[fl.Name]; ok {
			return
		}
		titles := make([]string, len(flagGroups))
		for i, g := range flagGroups {
			titles[i] = g.title
		}
		problems = append(problems, fmt.Sprintf("--%s is in no group of `sandbox-mcp --help`: add it to one of flagGroups in cmd/sandbox-mcp/usage.go (%s), or to deprecatedFlags if it is an old name", fl.Name, strings.Join(titles, ", ")))
	})
	return problems
}
