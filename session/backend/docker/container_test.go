package docker

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
)

func testParams() ContainerParams {
	return ContainerParams{
		Name:           "sandbox-mcp-sb-1-1",
		Image:          "sandbox-mcp-runtime:abc",
		Labels:         map[string]string{LabelManaged: "1", LabelInstance: "srv-1", LabelSandbox: "sb-1"},
		UID:            1000,
		GID:            1000,
		Env:            []string{"HOME=/tmp", "A=b"},
		WorkspaceBytes: 512 << 20,
		TmpBytes:       64 << 20,
		Memory:         1 << 30,
		NanoCPUs:       1e9,
		Pids:           256,
		NoFile:         4096,
		Network:        "none",
	}
}

// TestContainerSpec checks the hardening of a sandbox container (user,
// read-only root, capabilities, privileges, seccomp, limits, mounts,
// network) field by field, without an engine.
func TestContainerSpec(t *testing.T) {
	p := testParams()
	o := ContainerSpec(p)
	c, h := o.Config, o.HostConfig

	check := func(what string, ok bool) {
		t.Helper()
		if !ok {
			t.Errorf("%s: config %+v host %+v", what, c, h)
		}
	}
	check("name", o.Name == p.Name)
	check("image", c.Image == p.Image)
	check("init and agent start as root", c.User == "0:0")
	check("agent as entrypoint, told the non-root numeric user of commands", slices.Equal(c.Entrypoint, []string{AgentPath}) && slices.Equal(c.Cmd, []string{"-user=1000:1000"}))
	check("working dir", c.WorkingDir == "/workspace")
	check("env is exactly the given list", slices.Equal(c.Env, p.Env))
	check("labels", c.Labels[LabelSandbox] == "sb-1" && c.Labels[LabelInstance] == "srv-1" && c.Labels[LabelManaged] == "1")
	// Stdin outlives an attach: a server that dies leaves the agent on its
	// lease, for the next server to attach again (docs/restart.md).
	check("stdin open past an attach", c.OpenStdin && !c.StdinOnce && c.AttachStdin && c.AttachStdout && c.AttachStderr && !c.Tty)
	check("no tty", !c.Tty)

	check("read-only rootfs", h.ReadonlyRootfs)
	check("cap drop all", slices.Equal(h.CapDrop, []string{"ALL"}))
	check("cap add exactly SETUID and SETGID", slices.Equal(h.CapAdd, []string{"CAP_SETGID", "CAP_SETUID"}))
	check("not privileged", !h.Privileged)
	check("no-new-privileges", slices.Contains(h.SecurityOpt, "no-new-privileges=true"))
	for _, s := range h.SecurityOpt {
		check("default seccomp kept", !strings.HasPrefix(s, "seccomp"))
		check("default apparmor kept", !strings.HasPrefix(s, "apparmor"))
	}
	check("init reaps zombies", h.Init != nil && *h.Init)
	check("auto remove", h.AutoRemove)
	check("no engine log of the protocol", h.LogConfig.Type == "none")
	check("network none", h.NetworkMode == "none" && o.NetworkingConfig == nil)
	check("no host binds", len(h.Binds) == 0 && len(h.VolumesFrom) == 0)
	check("the one mount: an empty resolv.conf, read-only", len(h.Mounts) == 1 && h.Mounts[0].Type == "bind" &&
		h.Mounts[0].Source == "/dev/null" && h.Mounts[0].Target == "/etc/resolv.conf" && h.Mounts[0].ReadOnly)
	check("no devices", len(h.Devices) == 0 && len(h.DeviceRequests) == 0 && len(h.DeviceCgroupRules) == 0)
	check("host namespaces not shared", h.PidMode == "" && h.IpcMode == container.IPCModePrivate && h.UTSMode == "" && h.UsernsMode == "" && h.CgroupnsMode == "")
	check("no published ports", len(h.PortBindings) == 0 && !h.PublishAllPorts)
	check("memory", h.Memory == 1<<30)
	check("no swap", h.MemorySwap == h.Memory)
	check("cpus", h.NanoCPUs == 1e9)
	check("pids", h.PidsLimit != nil && *h.PidsLimit == 256)
	check("nofile", len(h.Ulimits) == 1 && h.Ulimits[0].Name == "nofile" && h.Ulimits[0].Soft == 4096 && h.Ulimits[0].Hard == 4096)
	check("runtime default", h.Runtime == "")
	check("no restart", h.RestartPolicy.Name == "" || h.RestartPolicy.Name == "no")
	check("no extra hosts or dns", len(h.ExtraHosts) == 0 && len(h.DNS) == 0)
	p.DNS = []netip.Addr{netip.MustParseAddr("198.18.0.1")}
	check("dns replaced", slices.Equal(ContainerSpec(p).HostConfig.DNS, p.DNS))
	p.DNS = nil

	ws := h.Tmpfs["/workspace"]
	for _, opt := range []string{"rw", "exec", "nosuid", "nodev", "size=536870912", "uid=1000", "gid=1000", "mode=0755"} {
		check("workspace tmpfs "+opt, slices.Contains(strings.Split(ws, ","), opt))
	}
	tmp := h.Tmpfs["/tmp"]
	for _, opt := range []string{"rw", "nosuid", "nodev", "size=67108864", "mode=1777"} {
		check("/tmp tmpfs "+opt, slices.Contains(strings.Split(tmp, ","), opt))
	}
	check("only two tmpfs", len(h.Tmpfs) == 2)

	// Read-only: the workspace mount itself is read-only.
	p.WorkspaceReadOnly = true
	ro := ContainerSpec(p).HostConfig.Tmpfs["/workspace"]
	check("read-only workspace", strings.HasPrefix(ro, "ro,") && !slices.Contains(strings.Split(ro, ","), "rw"))

	// A network name joins that network only.
	p.Network = "sandbox-mcp-net-sb-1"
	n := ContainerSpec(p)
	check("network mode", n.HostConfig.NetworkMode == "sandbox-mcp-net-sb-1")
	check("endpoint", n.NetworkingConfig != nil && len(n.NetworkingConfig.EndpointsConfig) == 1 && n.NetworkingConfig.EndpointsConfig["sandbox-mcp-net-sb-1"] != nil)
	p.NetworkAddr = netip.MustParseAddr("198.18.0.2")
	ep := ContainerSpec(p).NetworkingConfig.EndpointsConfig["sandbox-mcp-net-sb-1"]
	check("the address the proxy serves", ep.IPAMConfig != nil && ep.IPAMConfig.IPv4Address == p.NetworkAddr)

	// An operator's seccomp profile goes to the engine as the profile's
	// JSON, beside no-new-privileges.
	p.SeccompProfile = `{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[]}`
	so := ContainerSpec(p).HostConfig.SecurityOpt
	check("seccomp profile", slices.Equal(so, []string{"no-new-privileges=true", "seccomp=" + p.SeccompProfile}))

	// A bind-mounted agent is the one host path in the container beside the
	// empty resolv.conf: the agent's file alone, read-only, where the image
	// would hold it.
	p.AgentMount = "/var/lib/sandbox-mcp/agents/0123/sandbox-agent"
	m := ContainerSpec(p).HostConfig
	check("agent bind mount", len(m.Mounts) == 2 && m.Mounts[1].Type == mount.TypeBind && m.Mounts[1].Source == p.AgentMount &&
		m.Mounts[1].Target == AgentPath && m.Mounts[1].ReadOnly && len(m.Binds) == 0)
	check("resolv.conf kept beside the agent", m.Mounts[0].Source == ResolvConf && m.Mounts[0].Target == "/etc/resolv.conf" && m.Mounts[0].ReadOnly)

	// The spec does not share the caller's slices and maps.
	p2 := testParams()
	o2 := ContainerSpec(p2)
	p2.Env[0] = "CHANGED=1"
	p2.Labels[LabelSandbox] = "changed"
	check("env copied", o2.Config.Env[0] == "HOME=/tmp")
	check("labels copied", o2.Config.Labels[LabelSandbox] == "sb-1")
}

func TestOrphaned(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		state string
		age   time.Duration
		want  bool
	}{
		{"running", time.Hour, false}, // a live server's, whatever its age
		{"paused", time.Hour, false},
		{"restarting", time.Hour, false},
		{"removing", time.Hour, false},
		{"exited", time.Second, true},
		{"dead", time.Second, true},
		{"created", time.Second, false}, // its server may be starting it now
		{"created", orphanGrace + time.Second, true},
	} {
		if got := orphaned(tc.state, now.Add(-tc.age), now); got != tc.want {
			t.Errorf("orphaned(%s, age %s) = %v, want %v", tc.state, tc.age, got, tc.want)
		}
	}
}
