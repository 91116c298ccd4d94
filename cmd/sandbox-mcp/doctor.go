package main

import (
	"context"
	"debug/elf"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/session"
	"github.com/sandbox-mcp/sandbox-mcp/session/engine"
)

// doctor checks what the server needs and says what to fix. It exits 1 if
// a check failed; warnings do not fail it.
func doctor(ctx context.Context, args []string, w io.Writer, getenv func(string) string) int {
	failed := false
	ok := func(format string, a ...any) { fmt.Fprintf(w, "ok    "+format+"\n", a...) }
	warn := func(format string, a ...any) { fmt.Fprintf(w, "warn  "+format+"\n", a...) }
	fail := func(format string, a ...any) {
		failed = true
		fmt.Fprintf(w, "FAIL  "+format+"\n", a...)
	}
	defer func() {
		if failed {
			fmt.Fprintln(w, "\nsandbox-mcp is not ready: fix the FAIL lines above.")
		} else {
			fmt.Fprintln(w, "\nsandbox-mcp is ready.")
		}
	}()

	cfg, err := ParseConfig(args, getenv)
	if err != nil {
		fail("configuration: %v", err)
		return 1
	}
	ok("configuration (state dir %s)", cfg.StateDir)

	if err := checkAgentBinary(cfg.AgentBin); err != nil {
		fail("agent binary %s: %v; build it with `make build`, or point --agent-bin at it", cfg.AgentBin, err)
	} else {
		ok("agent binary %s", cfg.AgentBin)
	}

	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cli, err := client.New(client.FromEnv)
	if err != nil {
		fail("docker client: %v", err)
		return 1
	}
	defer cli.Close()
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	ping, err := cli.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true})
	pcancel()
	if err != nil {
		fail("Docker engine not reachable: %v; start the engine (e.g. `systemctl start docker`) or set DOCKER_HOST", err)
		return 1
	}
	sv, err := cli.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		fail("engine version: %v", err)
		return 1
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

	netName := "sandbox-mcp-doctor-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := cli.NetworkCreate(ctx, netName, client.NetworkCreateOptions{
		Driver: "bridge", Internal: true, Labels: map[string]string{engine.LabelManaged: "1"},
	}); err != nil {
		warn("cannot create an internal network (%v): --network=allowlist will not work", err)
	} else {
		_, _ = cli.NetworkRemove(ctx, netName, client.NetworkRemoveOptions{})
		ok("internal networks can be created (for --network=allowlist)")
	}

	if failed {
		return 1
	}
	start := time.Now()
	m, err := session.NewManager(ctx, session.Options{
		Client: cli, Image: cfg.Image, AgentBinary: cfg.AgentBin, Policy: cfg.Policy,
		StateDir: cfg.StateDir, Runtime: cfg.Runtime, Instance: "doctor", NetworkPool: cfg.NetworkPool,
		SeccompProfile: cfg.SeccompProfile,
	})
	if err != nil {
		fail("sandbox runtime: %v", err)
		return 1
	}
	defer m.Close(context.Background())
	ok("runtime image %s (%s)", m.RuntimeImage(), time.Since(start).Round(time.Millisecond))
	sb, err := m.Sandbox("doctor", "")
	if err != nil {
		fail("sandbox: %v", err)
		return 1
	}
	start = time.Now()
	res, err := sb.Exec(ctx, session.ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: 30 * time.Second})
	first := time.Since(start)
	switch {
	case err != nil:
		fail("a sandbox could not run `true`: %v", err)
	case res.ExitCode != 0:
		fail("`true` exited %d in a sandbox", res.ExitCode)
	default:
		start = time.Now()
		_, err = sb.Exec(ctx, session.ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: 30 * time.Second})
		if err != nil {
			fail("second exec: %v", err)
		} else {
			ok("sandbox runs commands: first exec %s (container start included), next %s",
				first.Round(time.Millisecond), time.Since(start).Round(100*time.Microsecond))
		}
	}
	if !failed {
		if msg, allowed := checkIOURing(ctx, sb, cfg.SeccompProfileFile); allowed {
			warn("%s", msg)
		} else {
			ok("%s", msg)
		}
		checkHardening(ctx, cli, sb, ok, warn, fail)
	}
	m.Release("doctor")
	if failed {
		return 1
	}
	return 0
}

// checkIOURing runs the agent's io_uring probe in a sandbox: io_uring has
// been a rich source of kernel escapes, and the engine's default seccomp
// profile allows it before Docker 25. It returns what to print, and whether
// sandboxes can use io_uring (a warning). A probe that cannot run is a
// warning too: the answer is unknown.
func checkIOURing(ctx context.Context, sb *session.Sandbox, profileFile string) (msg string, allowed bool) {
	profile := "the engine's default seccomp profile"
	if profileFile != "" {
		profile = "--seccomp-profile " + profileFile
	}
	res, err := sb.Exec(ctx, session.ExecRequest{Argv: []string{engine.AgentPath, "probe-io-uring"}, Cwd: ".", Timeout: 30 * time.Second, MaxOutput: 4 << 10})
	out := strings.TrimSpace(string(res.Stdout))
	switch {
	case err != nil || res.ExitCode != 0:
		return fmt.Sprintf("could not check whether sandboxes can use io_uring (%v, exit %d, %q)", err, res.ExitCode, out), true
	case out == "allowed":
		return "sandboxes can call io_uring_setup under " + profile + " (Docker before 25.0 allows io_uring, a frequent source of kernel exploits): " +
			"use a newer engine, or start sandbox-mcp with --seccomp-profile examples/seccomp-no-io_uring.json (the engine's default profile without io_uring)", true
	case strings.HasPrefix(out, "blocked: "):
		return fmt.Sprintf("sandboxes cannot use io_uring under %s (io_uring_setup: %s)", profile, strings.TrimPrefix(out, "blocked: ")), false
	default:
		return fmt.Sprintf("could not check whether sandboxes can use io_uring: the probe answered %q", out), true
	}
}

// checkHardening checks a running sandbox: its container as the engine
// reports it, and what a command and the agent run as, seen from inside.
func checkHardening(ctx context.Context, cli *client.Client, sb *session.Sandbox, ok, warn, fail func(string, ...any)) {
	uid, gid := session.DefaultUID, session.DefaultUID
	insp, err := cli.ContainerInspect(ctx, sb.ContainerID(), client.ContainerInspectOptions{})
	if err != nil {
		fail("inspect the sandbox container: %v", err)
		return
	}
	if p := engine.HardeningProblems(insp.Container, uid, gid); len(p) > 0 {
		for _, msg := range p {
			fail("sandbox hardening: %s", msg)
		}
	} else {
		ok("sandbox hardening (docker inspect): init and agent as root with CAP_SETUID and CAP_SETGID only, no-new-privileges, read-only root, limits")
	}
	res, err := sb.Exec(ctx, session.ExecRequest{
		Argv: []string{"sh", "-c", "cat /proc/self/status; echo @@@; cat /proc/$PPID/status"},
		Cwd:  ".", Timeout: 30 * time.Second, MaxOutput: 64 << 10,
	})
	if err != nil || res.ExitCode != 0 {
		warn("cannot check what commands run as (the image needs sh and cat): %v %s", err, strings.TrimSpace(string(res.Stderr)))
		return
	}
	cmdStatus, agentStatus, _ := strings.Cut(string(res.Stdout), "@@@\n")
	p := append(engine.CommandStatusProblems([]byte(cmdStatus), uid, gid), engine.AgentStatusProblems([]byte(agentStatus), uid, gid)...)
	for _, msg := range p {
		fail("sandbox identities: %s", msg)
	}
	if len(p) == 0 {
		ok("commands run as %d:%d with no capability, no_new_privs and a seccomp filter; the agent keeps uid 0 as its real and saved uid, out of their reach", uid, gid)
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
