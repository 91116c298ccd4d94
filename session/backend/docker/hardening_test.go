package docker

import (
	"slices"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
)

// TestHardeningProblems: a container made from ContainerSpec passes, and each
// weakening of it is named.
func TestHardeningProblems(t *testing.T) {
	good := func() container.InspectResponse {
		o := ContainerSpec(testParams())
		return container.InspectResponse{Config: o.Config, HostConfig: o.HostConfig}
	}
	if p := HardeningProblems(good(), 1000, 1000); len(p) != 0 {
		t.Fatalf("the spec's own container: %v", p)
	}
	// With the agent bind-mounted, as the engine reports it.
	bound := testParams()
	bound.AgentMount = "/var/lib/sandbox-mcp/agents/0123/sandbox-agent"
	o := ContainerSpec(bound)
	withAgent := container.InspectResponse{Config: o.Config, HostConfig: o.HostConfig,
		Mounts: []container.MountPoint{{Type: "bind", Source: bound.AgentMount, Destination: AgentPath, RW: false}}}
	if p := HardeningProblems(withAgent, 1000, 1000); len(p) != 0 {
		t.Fatalf("the spec's own container with the agent bind-mounted: %v", p)
	}
	for _, tc := range []struct {
		name  string
		edit  func(*container.InspectResponse)
		found string
	}{
		{"commands as root", func(c *container.InspectResponse) { c.Config.Cmd = []string{"-user=0:0"} }, "arguments"},
		{"user 1000 for the agent", func(c *container.InspectResponse) { c.Config.User = "1000:1000" }, "user is"},
		{"no cap drop", func(c *container.InspectResponse) { c.HostConfig.CapDrop = nil }, "CapDrop"},
		{"an extra capability", func(c *container.InspectResponse) {
			c.HostConfig.CapAdd = append(c.HostConfig.CapAdd, "CAP_KILL")
		}, "CapAdd"},
		{"a missing capability", func(c *container.InspectResponse) { c.HostConfig.CapAdd = []string{"SETUID"} }, "CapAdd"},
		{"privileged", func(c *container.InspectResponse) { c.HostConfig.Privileged = true }, "privileged"},
		{"bind", func(c *container.InspectResponse) { c.HostConfig.Binds = []string{"/:/host"} }, "host mounts"},
		{"a mount beside the agent's", func(c *container.InspectResponse) {
			c.HostConfig.Mounts = append(agentMounts("/agent"), mount.Mount{Type: mount.TypeBind, Source: "/", Target: "/host"})
		}, "host mounts"},
		{"the agent writable", func(c *container.InspectResponse) {
			c.HostConfig.Mounts = []mount.Mount{{Type: mount.TypeBind, Source: "/agent", Target: AgentPath}}
		}, "host mounts"},
		{"a bind mount seen by the engine", func(c *container.InspectResponse) {
			c.Mounts = []container.MountPoint{{Type: "bind", Source: "/", Destination: "/host", RW: true}}
		}, "want tmpfs only"},
		{"another mount", func(c *container.InspectResponse) {
			c.HostConfig.Mounts = append(slices.Clone(c.HostConfig.Mounts), mount.Mount{Type: mount.TypeBind, Source: "/", Target: "/host"})
		}, "host mounts"},
		{"a writable resolv.conf", func(c *container.InspectResponse) {
			m := slices.Clone(c.HostConfig.Mounts)
			m[0].ReadOnly = false
			c.HostConfig.Mounts = m
		}, "host mounts"},
		{"an engine bind", func(c *container.InspectResponse) {
			c.Mounts = []container.MountPoint{{Type: "bind", Source: "/etc", Destination: "/etc/resolv.conf"}}
		}, "want tmpfs only"},
		{"host pid", func(c *container.InspectResponse) { c.HostConfig.PidMode = "host" }, "namespace"},
		{"swap", func(c *container.InspectResponse) { c.HostConfig.MemorySwap = -1 }, "swap"},
		{"no cpus", func(c *container.InspectResponse) { c.HostConfig.NanoCPUs = 0 }, "CPU"},
		{"no pids", func(c *container.InspectResponse) { c.HostConfig.PidsLimit = nil }, "PID"},
		{"writable root", func(c *container.InspectResponse) { c.HostConfig.ReadonlyRootfs = false }, "writable"},
		{"seccomp off", func(c *container.InspectResponse) {
			c.HostConfig.SecurityOpt = append(c.HostConfig.SecurityOpt, "seccomp=unconfined")
		}, "unconfined"},
		{"new privileges", func(c *container.InspectResponse) { c.HostConfig.SecurityOpt = nil }, "no-new-privileges"},
		{"no init", func(c *container.InspectResponse) { c.HostConfig.Init = nil }, "init"},
		{"logged", func(c *container.InspectResponse) { c.HostConfig.LogConfig.Type = "json-file" }, "logs"},
	} {
		c := good()
		// Config and HostConfig are pointers: give each case its own.
		cfg, host := *c.Config, *c.HostConfig
		c.Config, c.HostConfig = &cfg, &host
		tc.edit(&c)
		p := HardeningProblems(c, 1000, 1000)
		if len(p) == 0 || !strings.Contains(strings.Join(p, "\n"), tc.found) {
			t.Errorf("%s: problems %q, want one about %q", tc.name, p, tc.found)
		}
	}
}

// Status files as the kernel writes them (tabs, trailing spaces).
const (
	commandStatus = "Name:\tcat\nState:\tR (running)\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\n" +
		"Groups:\t1000 2000000007 \nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n" +
		"CapBnd:\t00000000000000c0\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n"
	agentStatus = "Name:\tagent\nState:\tS (sleeping)\nUid:\t0\t1000\t0\t1000\nGid:\t0\t1000\t0\t1000\n" +
		"Groups:\t\nCapInh:\t0000000000000000\nCapPrm:\t00000000000000c0\nCapEff:\t0000000000000000\n" +
		"CapBnd:\t00000000000000c0\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n"
)

func TestStatusProblems(t *testing.T) {
	if p := CommandStatusProblems([]byte(commandStatus), 1000, 1000); len(p) != 0 {
		t.Errorf("a hardened command: %v", p)
	}
	if p := AgentStatusProblems([]byte(agentStatus), 1000, 1000); len(p) != 0 {
		t.Errorf("a hardened agent: %v", p)
	}
	for _, tc := range []struct{ from, to, found string }{
		{"Uid:\t1000\t1000\t1000\t1000", "Uid:\t1000\t1000\t0\t1000", "uids"},
		{"Gid:\t1000\t1000\t1000\t1000", "Gid:\t1000\t0\t1000\t1000", "gids"},
		{"Groups:\t1000 2000000007 ", "Groups:\t1000 ", "groups"},
		{"Groups:\t1000 2000000007 ", "Groups:\t0 1000 ", "groups"},
		{"CapPrm:\t0000000000000000", "CapPrm:\t00000000000000c0", "CapPrm"},
		{"CapEff:\t0000000000000000", "CapEff:\t0000000000000080", "CapEff"},
		{"CapAmb:\t0000000000000000", "CapAmb:\t0000000000000040", "CapAmb"},
		{"NoNewPrivs:\t1", "NoNewPrivs:\t0", "NoNewPrivs"},
		{"Seccomp:\t2", "Seccomp:\t0", "Seccomp"},
	} {
		p := CommandStatusProblems([]byte(strings.Replace(commandStatus, tc.from, tc.to, 1)), 1000, 1000)
		if len(p) != 1 || !strings.Contains(p[0], tc.found) {
			t.Errorf("command with %q: %q, want one problem about %s", tc.to, p, tc.found)
		}
	}
	// Commands an unprivileged agent started (Kubernetes) have only the
	// sandbox user's group; the other checks are the same.
	pod := strings.Replace(commandStatus, "Groups:\t1000 2000000007 ", "Groups:\t1000 ", 1)
	if p := UnprivilegedCommandStatusProblems([]byte(pod), 1000, 1000); len(p) != 0 {
		t.Errorf("a hardened command in a pod: %v", p)
	}
	for _, tc := range []struct{ from, to, found string }{
		{"Groups:\t1000 ", "Groups:\t0 1000 ", "groups"},
		{"Groups:\t1000 ", "Groups:\t1000 27 ", "groups"},
		{"CapEff:\t0000000000000000", "CapEff:\t0000000000000080", "CapEff"},
		{"NoNewPrivs:\t1", "NoNewPrivs:\t0", "NoNewPrivs"},
	} {
		p := UnprivilegedCommandStatusProblems([]byte(strings.Replace(pod, tc.from, tc.to, 1)), 1000, 1000)
		if len(p) != 1 || !strings.Contains(p[0], tc.found) {
			t.Errorf("command in a pod with %q: %q, want one problem about %s", tc.to, p, tc.found)
		}
	}
	for _, tc := range []struct{ from, to, found string }{
		{"Uid:\t0\t1000\t0\t1000", "Uid:\t1000\t1000\t1000\t1000", "uids"}, // the sandbox user could signal it
		{"Uid:\t0\t1000\t0\t1000", "Uid:\t0\t0\t0\t0", "uids"},
		{"Gid:\t0\t1000\t0\t1000", "Gid:\t1000\t1000\t1000\t1000", "gids"},
		{"Groups:\t", "Groups:\t1000", "groups"},
		{"CapPrm:\t00000000000000c0", "CapPrm:\t00000000000000e0", "CapPrm"},
		{"CapEff:\t0000000000000000", "CapEff:\t00000000000000c0", "CapEff"},
		{"NoNewPrivs:\t1", "NoNewPrivs:\t0", "NoNewPrivs"},
	} {
		p := AgentStatusProblems([]byte(strings.Replace(agentStatus, tc.from, tc.to, 1)), 1000, 1000)
		if len(p) != 1 || !strings.Contains(p[0], tc.found) {
			t.Errorf("agent with %q: %q, want one problem about %s", tc.to, p, tc.found)
		}
	}
}
