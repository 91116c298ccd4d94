package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
)

const module = "github.com/sandbox-mcp/sandbox-mcp"

// hostRoots are the programs and packages of the server side.
var hostRoots = []string{
	module + "/cmd/sandbox-mcp",
	module + "/cmd/sandbox-bench",
	module + "/session/...",
	module + "/agentclient",
	module + "/tools/...",
	module + "/policy/...",
	module + "/netproxy/...",
	module + "/cmd/sandbox-mcp/...",
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

// pkg is what `go list` says of one package.
type pkg struct {
	ImportPath string
	Standard   bool
	Imports    []string // imported by its own files, test files left out
	Deps       []string // everything it builds from, test files left out
}

// graph is the module's package graph, listed once for every rule.
var graph struct {
	once sync.Once
	pkgs map[string]*pkg
	err  error
}

// load lists, with one `go list -deps` call, every package of this module
// and everything they build from, as they build for the agent's target:
// Linux without cgo.
func load(t *testing.T) map[string]*pkg {
	t.Helper()
	graph.once.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			graph.err = fmt.Errorf("this test runs `go list -deps` and found no go command on PATH (%v): put the Go toolchain's bin directory on PATH", err)
			return
		}
		args := []string{"list", "-deps", "-json=ImportPath,Standard,Imports,Deps", module + "/..."}
		cmd := exec.Command(goTool, args...)
		cmd.Env = append(os.Environ(), "GOOS=linux", "CGO_ENABLED=0")
		out, err := cmd.Output()
		if err != nil {
			var stderr string
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				stderr = string(ee.Stderr)
			}
			graph.err = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, stderr)
			return
		}
		graph.pkgs = make(map[string]*pkg)
		dec := json.NewDecoder(bytes.NewReader(out))
		for dec.More() {
			p := new(pkg)
			if err := dec.Decode(p); err != nil {
				graph.err = fmt.Errorf("go %s: %v", strings.Join(args, " "), err)
				return
			}
			graph.pkgs[p.ImportPath] = p
		}
		if graph.pkgs[module+"/cmd/sandbox-mcp"] == nil {
			graph.err = fmt.Errorf("go %s did not list %s/cmd/sandbox-mcp: the rules would check nothing", strings.Join(args, " "), module)
		}
	})
	if graph.err != nil {
		t.Fatal(graph.err)
	}
	return graph.pkgs
}

// matches reports whether the import path p matches the pattern, a package
// path or one ending in "/..." (the package and everything below it).
func matches(pattern, p string) bool {
	if root, ok := strings.CutSuffix(pattern, "/..."); ok {
		return p == root || strings.HasPrefix(p, root+"/")
	}
	return p == pattern
}

// deps lists the packages the named packages (paths or patterns) build
// from, themselves included, leaving out the standard library and test
// files, as they build for the agent's target.
func deps(t *testing.T, patterns ...string) []string {
	t.Helper()
	pkgs := load(t)
	seen := make(map[string]bool)
	for _, pattern := range patterns {
		n := 0
		for path, p := range pkgs {
			if !matches(pattern, path) || p.Standard {
				continue
			}
			n++
			seen[path] = true
			for _, d := range p.Deps {
				if dp := pkgs[d]; dp != nil && !dp.Standard {
					seen[d] = true
				}
			}
		}
		if n == 0 {
			t.Fatalf("%s names no package of the module: the rule would check nothing", pattern)
		}
	}
	return slices.Sorted(maps.Keys(seen))
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
	{module + "/cmd/sandbox-mcp/internal/httpguard", module + "/cmd/sandbox-mcp",
		"the HTTP guard takes its own Options, not the server's Config"},
	{module + "/cmd/sandbox-mcp/internal/httpguard", module + "/tools",
		"the guard ends a session's sandbox through its Sessions interface"},
	{module + "/cmd/sandbox-mcp/internal/httpguard", module + "/session",
		"the guard checks requests; sandboxes are the tools' business"},
	{module + "/session/backend/kube", module + "/session/backend/docker",
		"the backends are siblings on the seam (session/backend): what both need belongs to the seam or to a package both import"},
	{module + "/session/backend/docker", module + "/session/backend/kube",
		"the backends are siblings on the seam (session/backend): what both need belongs to the seam or to a package both import"},
}

// mustNotImport lists, for a package, packages of this module it may not
// import itself (they may still be linked through a package it imports).
var mustNotImport = []struct {
	pkg, forbidden, why string
}{
	{module + "/tools", module + "/netproxy",
		"the tools know sandboxes and policy, not the egress proxy; what both report goes to the audit log, which main wires to each"},
	{module + "/cmd/sandbox-mcp/internal/audit", module + "/tools",
		"the audit log owns its line format (audit.ToolRecord); main turns the tools' Record into it"},
}

// imports lists the packages pkg imports itself, test files left out.
func imports(t *testing.T, path string) []string {
	t.Helper()
	p := load(t)[path]
	if p == nil {
		t.Fatalf("go list -deps %s/... did not list %s", module, path)
	}
	return p.Imports
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
			t.Errorf("%s links %s: the seam between a sandbox's life and what runs it is backend-neutral; Docker belongs in its backend, session/backend/docker", root, p)
		}
	}
}

// TestSessionLinksNoDocker: the registry and the state machine run any
// backend; main builds the backends (cmd/sandbox-mcp docker.go and kube.go),
// so session links neither the Docker backend nor the Docker client.
func TestSessionLinksNoDocker(t *testing.T) {
	root := module + "/session"
	list := deps(t, root)
	if !slices.Contains(list, module+"/session/backend") {
		t.Fatalf("go list -deps %s does not list session/backend: the rule would check nothing", root)
	}
	for _, p := range list {
		if linksDocker(p) || p == module+"/session/backend/docker" || p == module+"/session/backend/kube" {
			t.Errorf("%s links %s: session is the registry and the state machine on the backend seam; main builds the backend (Options.Backend), and what session needs of one is an interface in session/backend", root, p)
		}
	}
}

// TestAgentClientLinksNoDockerNorSession: the agent client is the server's
// end of the protocol, beside the agent (its other end) and agentproto (the
// wire); it talks to any stream, so it links no Docker client, no backend
// and not the session that drives it.
func TestAgentClientLinksNoDockerNorSession(t *testing.T) {
	root := module + "/agentclient"
	list := deps(t, root)
	if !slices.Contains(list, module+"/agentproto") {
		t.Fatalf("go list -deps %s does not list agentproto: the rule would check nothing", root)
	}
	for _, p := range list {
		if linksDocker(p) || p == module+"/session" || strings.HasPrefix(p, module+"/session/") {
			t.Errorf("%s links %s: the agent client speaks the protocol over a stream it is given; a sandbox's life (session) and what runs it (session/backend/...) drive it, not the other way round", root, p)
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

// TestPolicyIsPure: policy decides from its inputs alone; of this module it
// builds only on the error vocabulary, never on the wire, a sandbox or a
// tool.
func TestPolicyIsPure(t *testing.T) {
	root := module + "/policy"
	for _, p := range deps(t, root) {
		if p != root && p != module+"/internal/errcode" && (p == module || strings.HasPrefix(p, module+"/")) {
			t.Errorf("%s links %s: policy is pure and of this module builds only on internal/errcode; copy the constant it needs and check the copy in a test", root, p)
		}
	}
}

// TestInternalIsSortedByWhoUsesIt: a package under the module's internal/
// is shared; one that only a single command's packages import belongs under
// that command (cmd/NAME/internal/), where its users are.
func TestInternalIsSortedByWhoUsesIt(t *testing.T) {
	pkgs := load(t)
	importers := make(map[string][]string)
	for path, p := range pkgs {
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module+"/internal/") {
				importers[imp] = append(importers[imp], path)
			}
		}
	}
	if len(importers[module+"/internal/errcode"]) == 0 {
		t.Fatal("no package imports internal/errcode: the rule would check nothing")
	}
	for imp, users := range importers {
		cmds := make(map[string]bool)
		for _, u := range users {
			rest, ok := strings.CutPrefix(u, module+"/cmd/")
			if !ok {
				cmds[""] = true // a library package: the import is shared
				continue
			}
			name, _, _ := strings.Cut(rest, "/")
			cmds[name] = true
		}
		if len(cmds) == 1 && !cmds[""] {
			slices.Sort(users)
			t.Errorf("%s is imported only by %v, one command's packages: move it under that command's internal/", imp, users)
		}
	}
}
