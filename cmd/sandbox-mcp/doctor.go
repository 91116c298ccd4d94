package main

import (
	"context"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/session"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// report collects doctor's verdicts: ok and warn lines, and FAIL lines
// that make it exit 1.
type report struct {
	w      io.Writer
	failed bool
}

func (r *report) ok(format string, a ...any)   { fmt.Fprintf(r.w, "ok    "+format+"\n", a...) }
func (r *report) warn(format string, a ...any) { fmt.Fprintf(r.w, "warn  "+format+"\n", a...) }
func (r *report) fail(format string, a ...any) {
	r.failed = true
	fmt.Fprintf(r.w, "FAIL  "+format+"\n", a...)
}

// doctor checks what the server needs, on the backend the configuration
// names, and says what to fix. It exits 1 if a check failed; warnings do
// not fail it.
func doctor(ctx context.Context, args []string, w io.Writer, getenv func(string) string) int {
	if len(args) > 0 && args[0] == "help" {
		doctorUsage(w, getenv)
		return 0
	}
	cfg, err := ParseConfig(args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		doctorUsage(w, getenv)
		return 0
	}
	r := &report{w: w}
	defer func() {
		if r.failed {
			fmt.Fprintln(w, "\nsandbox-mcp is not ready: fix the FAIL lines above.")
		} else {
			fmt.Fprintln(w, "\nsandbox-mcp is ready.")
		}
	}()
	if err != nil {
		r.fail("configuration: %v", err)
		return 1
	}
	r.ok("configuration (state dir %s)", cfg.StateDir)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if cfg.Kube.Backend == BackendKubernetes {
		doctorKube(ctx, cfg, r)
	} else {
		doctorDocker(ctx, cfg, r)
	}
	if r.failed {
		return 1
	}
	return 0
}

// doctorDocker checks the Docker backend: the agent binary, the engine, the
// image, internal networks, and a real sandbox.
func doctorDocker(ctx context.Context, cfg Config, r *report) {
	ok, warn, fail := r.ok, r.warn, r.fail
	if err := checkAgentBinary(cfg.AgentBin); err != nil {
		fail("agent binary %s: %v; build it with `make build`, or point --agent-bin at it", cfg.AgentBin, err)
	} else {
		ok("agent binary %s", cfg.AgentBin)
	}

	cli, err := client.New(client.FromEnv)
	if err != nil {
		fail("docker client: %v", err)
		return
	}
	defer cli.Close()
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	ping, err := cli.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true})
	pcancel()
	if err != nil {
		fail("Docker engine not reachable: %v; start the engine (e.g. `systemctl start docker`) or set DOCKER_HOST", err)
		return
	}
	sv, err := cli.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		fail("engine version: %v", err)
		return
	}
	runc := ""
	for _, c := range sv.Components {
		if strings.EqualFold(c.Name, "runc") {
			runc = c.Version
		}
	}
	ok("Docker engine %s (API %s, negotiated %s), runc %s", sv.Version, sv.APIVersion, ping.APIVersion, orUnknown(runc))
	for _, m := range knownEscapes(sv.Version, runc) {
		warn("%s", m)
	}

	if _, err := cli.ImageInspect(ctx, cfg.Image); err != nil {
		if cerrdefs.IsNotFound(err) {
			fail("image %s is not on this engine (nothing can be pulled): build it with `make image`, or pass --image with a local image", cfg.Image)
		} else {
			fail("image %s: %v", cfg.Image, err)
		}
	} else {
		ok("image %s", cfg.Image)
	}
	for _, t := range cfg.Templates {
		if t.Image == cfg.Image {
			continue
		}
		if _, err := cli.ImageInspect(ctx, t.Image); err != nil {
			if cerrdefs.IsNotFound(err) {
				fail("template %s: image %s is not on this engine (nothing can be pulled): build it (e.g. FROM the default image, see `sandbox-mcp image`), or change the template's \"image\" in %s", t.Name, t.Image, cfg.ConfigFile)
			} else {
				fail("template %s: image %s: %v", t.Name, t.Image, err)
			}
		} else {
			ok("template %s: image %s", t.Name, t.Image)
		}
	}

	netName := "sandbox-mcp-doctor-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := cli.NetworkCreate(ctx, netName, client.NetworkCreateOptions{
		Driver: "bridge", Internal: true, Labels: map[string]string{docker.LabelManaged: "1"},
	}); err != nil {
		warn("cannot create an internal network (%v): --network=allowlist will not work", err)
	} else {
		_, _ = cli.NetworkRemove(ctx, netName, client.NetworkRemoveOptions{})
		ok("internal networks can be created (for --network=allowlist)")
	}

	if r.failed {
		return
	}
	start := time.Now()
	// What the server prepares in the background, prepared here before
	// doctor returns: a server started next finds it ready.
	dk, err := newDockerBackend(cfg, cli, "doctor", slog.New(slog.DiscardHandler))
	if err != nil {
		fail("sandbox runtime: %v", err)
		return
	}
	sd, err := loadSeed(cfg, dk)
	if err != nil {
		fail("sandbox runtime: %v", err)
		return
	}
	m, err := session.NewManager(ctx, session.Options{
		Backend: dk, Policy: cfg.Policy, StateDir: cfg.StateDir, Instance: "doctor", Seed: sd,
	})
	if err != nil {
		fail("sandbox runtime: %v", err)
		return
	}
	defer m.Close(context.Background())
	if err := m.WaitPrepared(ctx, 0, 0, nil); err != nil {
		fail("preparing sandboxes: %v", err)
		return
	}
	how := "the agent bind-mounted from " + m.AgentMountPath()
	if m.AgentMountPath() == "" {
		how = "the agent in the image"
	}
	ok("runtime image %s, %s (prepared in %s)", m.RuntimeImage(), how, time.Since(start).Round(time.Millisecond))
	sb := checkSandbox(ctx, m, r, docker.AgentPath, dockerSeccomp(cfg.SeccompProfileFile), "container start included")
	if sb == nil {
		return
	}
	checkHardening(ctx, cli, sb, r)
	m.Release("doctor")
}

// checkSandbox starts the doctor's sandbox on m and runs commands in it:
// `true` twice (the first time includes the sandbox's start, named by
// startNote) and the io_uring probe of the agent at agentPath. It returns
// the sandbox, or nil after a FAIL.
func checkSandbox(ctx context.Context, m *session.Manager, r *report, agentPath string, seccomp seccompView, startNote string) *session.Sandbox {
	sb, err := m.Sandbox("doctor", "")
	if err != nil {
		r.fail("sandbox: %v", err)
		return nil
	}
	start := time.Now()
	res, err := sb.Exec(ctx, session.ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: 30 * time.Second})
	first := time.Since(start)
	switch {
	case err != nil:
		r.fail("a sandbox could not run `true`: %v", err)
		return nil
	case res.ExitCode != 0:
		r.fail("`true` exited %d in a sandbox", res.ExitCode)
		return nil
	}
	start = time.Now()
	if _, err = sb.Exec(ctx, session.ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: 30 * time.Second}); err != nil {
		r.fail("second exec: %v", err)
		return nil
	}
	r.ok("sandbox runs commands: first exec %s (%s), next %s",
		first.Round(time.Millisecond), startNote, time.Since(start).Round(100*time.Microsecond))
	if msg, allowed := checkIOURing(ctx, sb, agentPath, seccomp); allowed {
		r.warn("%s", msg)
	} else {
		r.ok("%s", msg)
	}
	return sb
}

// seccompView names the seccomp profile sandboxes run under, and what to
// do if it lets them use io_uring.
type seccompView struct{ profile, fix string }

// dockerSeccomp is the Docker backend's view: the engine's default profile
// or --seccomp-profile.
func dockerSeccomp(profileFile string) seccompView {
	v := seccompView{profile: "the engine's default seccomp profile",
		fix: "Docker before 25.0 allows io_uring, a frequent source of kernel exploits: use a newer engine, or start sandbox-mcp with --seccomp-profile examples/seccomp-no-io_uring.json (the engine's default profile without io_uring)"}
	if profileFile != "" {
		v.profile = "--seccomp-profile " + profileFile
		v.fix = "io_uring is a frequent source of kernel exploits: remove io_uring_setup, io_uring_enter and io_uring_register from the profile (examples/seccomp-no-io_uring.json shows how)"
	}
	return v
}

// kubeSeccomp is the Kubernetes backend's view: the node runtime's default
// profile (RuntimeDefault), or the node-local profile given with
// --seccomp-localhost-profile (the two Pod Security "restricted" admits).
func kubeSeccomp(localhost string) seccompView {
	if localhost != "" {
		return seccompView{profile: "the node-local seccomp profile " + localhost,
			fix: "io_uring is a frequent source of kernel exploits: remove io_uring_setup, io_uring_enter and io_uring_register from that profile on every node (examples/seccomp-no-io_uring.json shows how)"}
	}
	return seccompView{profile: "the node runtime's RuntimeDefault seccomp profile",
		fix: "io_uring is a frequent source of kernel exploits: install a profile without it on every node and pass --seccomp-localhost-profile (examples/seccomp-no-io_uring.json is one), or run sandboxes under a runtime class with a kernel of its own (--runtime-class for gVisor or Kata)"}
}

// checkIOURing runs the agent's io_uring probe in a sandbox: io_uring has
// been a rich source of kernel escapes, and many default seccomp profiles
// allow it. It returns what to print, and whether sandboxes can use
// io_uring (a warning). A probe that cannot run is a warning too: the
// answer is unknown.
func checkIOURing(ctx context.Context, sb *session.Sandbox, agentPath string, v seccompView) (msg string, allowed bool) {
	res, err := sb.Exec(ctx, session.ExecRequest{Argv: []string{agentPath, "probe-io-uring"}, Cwd: ".", Timeout: 30 * time.Second, MaxOutput: 4 << 10})
	out := strings.TrimSpace(string(res.Stdout))
	switch {
	case err != nil || res.ExitCode != 0:
		return fmt.Sprintf("could not check whether sandboxes can use io_uring (%v, exit %d, %q)", err, res.ExitCode, out), true
	case out == "allowed":
		return "sandboxes can call io_uring_setup under " + v.profile + " (" + v.fix + ")", true
	case strings.HasPrefix(out, "blocked: "):
		return fmt.Sprintf("sandboxes cannot use io_uring under %s (io_uring_setup: %s)", v.profile, strings.TrimPrefix(out, "blocked: ")), false
	default:
		return fmt.Sprintf("could not check whether sandboxes can use io_uring: the probe answered %q", out), true
	}
}

// checkHardening checks a running sandbox: its container as the engine
// reports it, and what a command and the agent run as, seen from inside.
func checkHardening(ctx context.Context, cli *client.Client, sb *session.Sandbox, r *report) {
	uid, gid := session.DefaultUID, session.DefaultUID
	insp, err := cli.ContainerInspect(ctx, sb.ContainerID(), client.ContainerInspectOptions{})
	if err != nil {
		r.fail("inspect the sandbox container: %v", err)
		return
	}
	if p := docker.HardeningProblems(insp.Container, uid, gid); len(p) > 0 {
		for _, msg := range p {
			r.fail("sandbox hardening: %s", msg)
		}
	} else {
		r.ok("sandbox hardening (docker inspect): init and agent as root with CAP_SETUID and CAP_SETGID only, no-new-privileges, read-only root, limits")
	}
	checkIdentities(ctx, sb, r, true)
}

// checkIdentities looks from inside a sandbox at what a command runs as
// and, with agentToo (the Docker backend, where the agent keeps uid 0 out
// of the commands' reach), at what the agent runs as.
func checkIdentities(ctx context.Context, sb *session.Sandbox, r *report, agentToo bool) {
	uid, gid := session.DefaultUID, session.DefaultUID
	res, err := sb.Exec(ctx, session.ExecRequest{
		Argv: []string{"sh", "-c", "cat /proc/self/status; echo @@@; cat /proc/$PPID/status"},
		Cwd:  ".", Timeout: 30 * time.Second, MaxOutput: 64 << 10,
	})
	if err != nil || res.ExitCode != 0 {
		r.warn("cannot check what commands run as (the image needs sh and cat): %v %s", err, strings.TrimSpace(string(res.Stderr)))
		return
	}
	cmdStatus, agentStatus, _ := strings.Cut(string(res.Stdout), "@@@\n")
	var p []string
	if agentToo {
		p = append(docker.CommandStatusProblems([]byte(cmdStatus), uid, gid), docker.AgentStatusProblems([]byte(agentStatus), uid, gid)...)
	} else {
		p = docker.UnprivilegedCommandStatusProblems([]byte(cmdStatus), uid, gid)
	}
	for _, msg := range p {
		r.fail("sandbox identities: %s", msg)
	}
	switch {
	case len(p) > 0:
	case agentToo:
		r.ok("commands run as %d:%d with no capability, no_new_privs and a seccomp filter; the agent keeps uid 0 as its real and saved uid, out of their reach", uid, gid)
	default:
		r.ok("commands run as %d:%d with no capability, no_new_privs and a seccomp filter", uid, gid)
	}
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// checkAgentBinary checks that the agent is a static Linux executable: it
// must run in any image, with no libc to lean on.
func checkAgentBinary(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("it is dynamically linked; build it with CGO_ENABLED=0")
		}
	}
	return nil
}

// knownEscapes returns warnings for engine and runc versions with published
// escapes. Distributions patch without changing the version (Debian's
// docker.io 20.10 with runc 1.1.5 carries the fixes), so these are warnings
// to check, never refusals.
func knownEscapes(engine, runc string) []string {
	var out []string
	note := " (distributions often patch without changing the version; check your vendor's advisories)"
	if e := parseVersion(engine); e != nil {
		fixed := versionAtLeast(e, 26, 0, 0) || (e[0] == 25 && versionAtLeast(e, 25, 0, 4)) || (e[0] == 23 && versionAtLeast(e, 23, 0, 11))
		if !fixed {
			out = append(out, "Docker "+engine+" predates the fix for CVE-2024-29018 (DNS exfiltration from internal networks; matters for --network=allowlist)"+note)
		}
		if !versionAtLeast(e, 28, 3, 3) {
			out = append(out, "Docker "+engine+" predates the fix for CVE-2025-54388 (firewall isolation lost on a firewalld reload)"+note)
		}
	}
	if r := parseVersion(runc); r != nil {
		if !versionAtLeast(r, 1, 1, 12) {
			out = append(out, "runc "+runc+" predates the fix for CVE-2024-21626 (container escape through a leaked fd)"+note)
		}
		if !(versionAtLeast(r, 1, 3, 3) || (r[0] == 1 && r[1] == 2 && versionAtLeast(r, 1, 2, 8))) {
			out = append(out, "runc "+runc+" predates the fixes for CVE-2025-31133, CVE-2025-52565 and CVE-2025-52881 (procfs and masked-path races)"+note)
		}
	}
	return out
}

// parseVersion reads the leading major.minor.patch of a version string.
func parseVersion(s string) []int {
	s = strings.TrimPrefix(s, "v")
	end := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if end >= 0 {
		s = s[:end]
	}
	parts := strings.Split(s, ".")
	if len(parts) < 2 {
		return nil
	}
	v := make([]int, 3)
	for i := 0; i < 3 && i < len(parts); i++ {
		n, err := strconv.Atoi(parts[i])
		if err != nil {
			return nil
		}
		v[i] = n
	}
	return v
}

func versionAtLeast(v []int, major, minor, patch int) bool {
	want := []int{major, minor, patch}
	for i := range 3 {
		if v[i] != want[i] {
			return v[i] > want[i]
		}
	}
	return true
}
