package session

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// TestContainerInspect checks, on the real engine, that a sandbox container
// carries the hardening the server applies to every sandbox (non-root user,
// read-only root, no capabilities, no new privileges, seccomp, limits, its
// own network), as docker inspect shows it: the CIS Docker Benchmark's
// runtime checks.
func TestContainerInspect(t *testing.T) {
	m := testManager(t, nil)
	sb := newSandbox(t, m)
	run(t, sb, "true")
	checkHardened(t, m, sb.ContainerID(), sb.ID())

	// What commands and the agent run as, from inside.
	st := string(sh(t, sb, "cat /proc/self/status; echo @@@; cat /proc/$PPID/status").Stdout)
	cmdStatus, agentStatus, _ := strings.Cut(st, "@@@\n")
	for _, p := range docker.CommandStatusProblems([]byte(cmdStatus), 1000, 1000) {
		t.Errorf("command: %s", p)
	}
	for _, p := range docker.AgentStatusProblems([]byte(agentStatus), 1000, 1000) {
		t.Errorf("agent: %s", p)
	}
	if !strings.Contains(agentStatus, "Name:\tagent") {
		t.Errorf("the shell's parent is not the agent:\n%s", agentStatus)
	}

	// And from inside: the mounts are what inspect says.
	out := string(sh(t, sb, "grep -E ' /workspace | /tmp | / ' /proc/mounts").Stdout)
	for _, want := range []string{"/workspace tmpfs rw,nosuid,nodev", "/tmp tmpfs rw,nosuid,nodev"} {
		if !strings.Contains(out, want) {
			t.Errorf("mounts: %s not in %s", want, out)
		}
	}
	if !strings.Contains(out, " / ") || !strings.Contains(strings.SplitN(out[strings.Index(out, " / "):], "\n", 2)[0], " ro,") {
		t.Errorf("rootfs not read-only: %s", out)
	}
}

// checkHardened asserts, from docker inspect, the hardening of a sandbox
// container (see TestContainerInspect).
func checkHardened(t *testing.T, m *Manager, containerID, sandbox string) {
	t.Helper()
	res, err := testenv.Engine(t).ContainerInspect(context.Background(), containerID, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, h := res.Container.Config, res.Container.HostConfig
	check := func(what string, ok bool) {
		t.Helper()
		if !ok {
			t.Errorf("docker inspect %s: %s", containerID[:12], what)
		}
	}
	for _, p := range docker.HardeningProblems(res.Container, 1000, 1000) {
		t.Errorf("docker inspect %s: %s", containerID[:12], p)
	}
	// The CIS assertions HardeningProblems covers, spelled out here too.
	check("4.1 user: root init and agent, commands as 1000:1000: "+c.User, c.User == "0:0" && slices.Equal(c.Cmd, []string{"-user=1000:1000"}))
	check(fmt.Sprintf("5.4 CapDrop ALL, CapAdd SETUID SETGID only: %q %q", h.CapDrop, h.CapAdd), len(h.CapDrop) == 1 && strings.EqualFold(strings.TrimPrefix(h.CapDrop[0], "CAP_"), "ALL") &&
		slices.Equal(h.CapAdd, []string{"CAP_SETGID", "CAP_SETUID"}))
	check("5.5 not privileged", !h.Privileged)
	check("5.6 no binds", len(h.Binds) == 0)
	for _, mnt := range res.Container.Mounts {
		// The agent's file and the empty resolv.conf, bind-mounted read-only,
		// are the exceptions.
		agent := mnt.Type == "bind" && mnt.Destination == docker.AgentPath && !mnt.RW
		resolv := mnt.Type == "bind" && mnt.Source == docker.ResolvConf && mnt.Destination == "/etc/resolv.conf" && !mnt.RW
		check(fmt.Sprintf("5.6 no mounts but tmpfs, the agent's file and the empty resolv.conf, read-only: %s %s -> %s rw=%v", mnt.Type, mnt.Source, mnt.Destination, mnt.RW), mnt.Type == "tmpfs" || agent || resolv)
		check("5.32 no docker socket", !strings.Contains(mnt.Source, "docker.sock"))
	}
	check("5.10 network none: "+string(h.NetworkMode), h.NetworkMode == "none")
	check("5.16 pid ns", !h.PidMode.IsHost())
	check("5.17 ipc ns", !h.IpcMode.IsHost())
	check("5.21 uts ns", !h.UTSMode.IsHost())
	check("5.31 userns", !h.UsernsMode.IsHost())
	check("5.11 memory = swap", h.Memory > 0 && h.MemorySwap == h.Memory)
	check("5.12 cpus", h.NanoCPUs > 0)
	check("5.13 read-only rootfs", h.ReadonlyRootfs)
	check("5.18 no devices", len(h.Devices) == 0)
	check("5.29 pids", h.PidsLimit != nil && *h.PidsLimit > 0)
	nnp := false
	for _, s := range h.SecurityOpt {
		check("5.22 seccomp not unconfined", !strings.Contains(s, "unconfined"))
		nnp = nnp || strings.HasPrefix(s, "no-new-privileges")
	}
	check("5.26 no-new-privileges", nnp)
	check("init", h.Init != nil && *h.Init)
	check("auto remove", h.AutoRemove)
	check("log driver none", h.LogConfig.Type == "none")
	check("labels", c.Labels[docker.LabelInstance] == m.Instance() && c.Labels[docker.LabelSandbox] == sandbox && c.Labels[docker.LabelManaged] == "1")
	check("workspace tmpfs", strings.Contains(h.Tmpfs["/workspace"], "size=67108864"))
}
