package layout

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/sandbox-mcp/sandbox-mcp"

// hostRoots are the programs and packages of the server side.
var hostRoots = []string{
	module + "/cmd/sandbox-mcp",
	module + "/cmd/sandbox-bench",
	module + "/session/...",
	module + "/tools/...",
	module + "/policy/...",
	module + "/netproxy/...",
	module + "/internal/audit",
	module + "/internal/httpguard",
}

// agentSide are the packages only the in-container program may link.
var agentSide = []string{
	module + "/agent",
	module + "/cmd/sandbox-agent",
}

// shared are the packages of this module both sides may link.
var shared = []string{
	module + "/agentproto",
	module + "/workspace",
	module + "/internal/errcode",
}

// agentExternal are the only module prefixes outside this module and the
// standard library that the agent may link.
var agentExternal = []string{"golang.org/x/sys/"}

// deps lists the packages the named packages build from (themselves
// included), leaving out the standard library and test files, as they build
// for the agent's target: Linux without cgo.
func deps(t *testing.T, pkgs ...string) []string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("this test runs `go list -deps` and found no go command on PATH (%v): put the Go toolchain's bin directory on PATH", err)
	}
	args := append([]string{"list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}"}, pkgs...)
	cmd := exec.Command(goTool, args...)
	cmd.Env = append(os.Environ(), "GOOS=linux", "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	var list []string
	for line := range strings.Lines(string(out)) {
		if p := strings.TrimSpace(line); p != "" {
			list = append(list, p)
		}
	}
	if len(list) == 0 {
		t.Fatalf("go %s listed no package", strings.Join(args, " "))
	}
	return list
}

func TestHostDoesNotLinkTheAgent(t *testing.T) {
	for _, root := range hostRoots {
		for _, p := range deps(t, root) {
			if slices.Contains(agentSide, p) || strings.HasPrefix(p, module+"/agent/") {
				t.Errorf("%s links %s, the in-container program: the server talks to the agent over agentproto only; move what it needs into a shared package (agentproto, workspace, internal/errcode)", root, p)
			}
		}
	}
}

func TestAgentLinksNoHostPackage(t *testing.T) {
	list := deps(t, agentSide...)
	for _, want := range agentSide {
		if !slices.Contains(list, want) {
			t.Fatalf("go list -deps %v does not list %s itself: the rule would check nothing", agentSide, want)
		}
	}
	for _, p := range list {
		switch {
		case slices.Contains(agentSide, p), slices.Contains(shared, p):
		case p == module || strings.HasPrefix(p, module+"/"):
			t.Errorf("the agent links %s, a package of the server side: the agent may import only %v of this module", p, shared)
		case !slices.ContainsFunc(agentExternal, func(prefix string) bool { return strings.HasPrefix(p, prefix) }):
			t.Errorf("the agent links %s: inside a sandbox it needs only the standard library and %v; keep the Docker client and the MCP SDK on the server side", p, agentExternal)
		}
	}
}

// mustNotLink lists, for a package, packages of this module it may not
// build from, and why.
var mustNotLink = []struct {
	pkg, forbidden, why string
}{
	{module + "/internal/httpguard", module + "/cmd/sandbox-mcp",
		"the HTTP guard takes its own Options, not the server's Config"},
	{module + "/internal/httpguard", module + "/tools",
		"the guard ends a session's sandbox through its Sessions interface"},
	{module + "/internal/httpguard", module + "/session",
		"the guard checks requests; sandboxes are the tools' business"},
}

// mustNotImport lists, for a package, packages of this module it may not
// import itself (they may still be linked through a package it imports).
var mustNotImport = []struct {
	pkg, forbidden, why string
}{
	{module + "/tools", module + "/netproxy",
		"the tools know sandboxes and policy, not the egress proxy; what both report goes to internal/audit, which main wires to each"},
	{module + "/tools", module + "/internal/audit",
		"the tools hand their records to a func (Deps.Audit); main wires the audit log to it"},
}

// imports lists the packages pkg imports itself, test files left out.
func imports(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, pkg).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

func TestPackagesImportOnlyWhatTheyMay(t *testing.T) {
	for _, r := range mustNotImport {
		list := imports(t, r.pkg)
		if len(list) == 0 {
			t.Fatalf("go list %s listed no import: the rule would check nothing", r.pkg)
		}
		if slices.Contains(list, r.forbidden) {
			t.Errorf("%s imports %s: %s", r.pkg, r.forbidden, r.why)
		}
	}
}

func TestPackagesLinkOnlyWhatTheyMay(t *testing.T) {
	for _, r := range mustNotLink {
		list := deps(t, r.pkg)
		if !slices.Contains(list, r.pkg) {
			t.Fatalf("go list -deps %s does not list %s itself: the rule would check nothing", r.pkg, r.pkg)
		}
		if slices.Contains(list, r.forbidden) {
			t.Errorf("%s links %s: %s", r.pkg, r.forbidden, r.why)
		}
	}
}

// dockerPrefixes are the module prefixes of the Docker engine's client.
var dockerPrefixes = []string{"github.com/moby/", "github.com/docker/", "github.com/containerd/"}

func linksDocker(p string) bool {
	return slices.ContainsFunc(dockerPrefixes, func(prefix string) bool { return strings.HasPrefix(p, prefix) })
}

func TestBackendSeamLinksNoDocker(t *testing.T) {
	root := module + "/session/backend"
	for _, p := range deps(t, root) {
		if linksDocker(p) {
			t.Errorf("%s links %s: the seam between a sandbox's life and what runs it is backend-neutral; Docker belongs in session/engine", root, p)
		}
	}
}

func TestSnapshotCommandLinksNoEngine(t *testing.T) {
	for _, root := range []string{module + "/snapshot", module + "/cmd/sandbox-mcp/internal/snapshotcli"} {
		list := deps(t, root)
		if !slices.Contains(list, root) {
			t.Fatalf("go list -deps %s does not list it: the rule would check nothing", root)
		}
		for _, p := range list {
			if linksDocker(p) || p == module+"/session" || strings.HasPrefix(p, module+"/session/") {
				t.Errorf("%s links %s: the snapshots in the state directory are read and written without an engine or a server; keep the snapshot store and `sandbox-mcp snapshot` free of session and Docker", root, p)
			}
		}
	}
}
