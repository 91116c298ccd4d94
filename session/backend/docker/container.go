package docker

import (
	"fmt"
	"maps"
	"net/netip"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// Paths inside every sandbox container.
const (
	// WorkspaceDir is the sandbox's workspace, a tmpfs.
	WorkspaceDir = agentproto.Workspace
	// AgentPath is where the runtime image holds the agent binary.
	AgentPath = "/.sandbox-mcp/agent"
)

// Labels put on every engine object the server makes.
const (
	// LabelManaged marks an object as sandbox-mcp's; its value is "1".
	LabelManaged = "io.sandbox-mcp"
	// LabelInstance names the server instance that made the object.
	LabelInstance = "io.sandbox-mcp.instance"
	// LabelSandbox names the sandbox the object belongs to.
	LabelSandbox = "io.sandbox-mcp.sandbox"
	// LabelCreated is the object's creation time (RFC 3339), for the sweep.
	LabelCreated = "io.sandbox-mcp.created"
	// LabelRuntime marks a runtime image (a base image plus the agent).
	LabelRuntime = "io.sandbox-mcp.runtime"
	// LabelToolbox, on a sandbox image, is its toolbox manifest: what it
	// has and lacks, as JSON, written by the image's build
	// (image/build.sh).
	LabelToolbox = "io.sandbox-mcp.toolbox"
)

// The identity a sandbox container starts with: its init and the agent run
// as root holding CAP_SETUID and CAP_SETGID and no other capability, which
// the agent uses only to start commands as the sandbox user (see
// ContainerSpec). Commands hold no capability.
const ContainerUser = "0:0"

// ContainerCapAdd returns the capabilities added back after dropping all,
// in the order the engine reports them.
func ContainerCapAdd() []string { return []string{"CAP_SETGID", "CAP_SETUID"} }

// ContainerParams are the inputs of ContainerSpec. Every field is set by the
// server from its policy; nothing here comes from a tool argument.
type ContainerParams struct {
	Name   string            // container name
	Image  string            // runtime image (base plus agent)
	Labels map[string]string // labels, LabelManaged and friends included
	UID    int               // non-root numeric user every command runs as
	GID    int
	Env    []string // the sandbox's whole environment (NAME=VALUE)
	// AgentMount is the host path of the agent, bind-mounted read-only
	// at AgentPath; "" when Image holds the agent.
	AgentMount string

	WorkspaceBytes    int64 // size of the /workspace tmpfs
	WorkspaceReadOnly bool  // mount /workspace read-only
	// WorkspaceInImage leaves /workspace to the image (a read-only
	// workspace with content, baked into the runtime image) instead of a
	// tmpfs; the read-only root filesystem keeps it unchanged.
	WorkspaceInImage bool
	TmpBytes         int64 // size of the /tmp tmpfs

	Memory   int64 // bytes of memory, and of memory+swap (no swap)
	NanoCPUs int64 // CPU quota in 1e-9 CPUs
	Pids     int64 // process limit
	NoFile   int64 // open-file limit (soft and hard)

	// Network is "none" or the name of the sandbox's own internal network.
	Network string
	// NetworkAddr is the container's address on Network (zero lets the
	// engine pick). The egress proxy serves this address only.
	NetworkAddr netip.Addr
	// DNS replaces the upstream resolvers of the engine's embedded
	// resolver (nil keeps them). A sandbox on an internal network gets its
	// gateway, where the firewall refuses port 53, so no query leaves. The
	// sandbox's own lookups never reach the embedded resolver (see
	// ResolvConf).
	DNS []netip.Addr
	// Runtime is the OCI runtime ("" for the engine's default, or "runsc").
	Runtime string
	// SeccompProfile is a seccomp profile (JSON) replacing the engine's
	// default; "" keeps the default.
	SeccompProfile string
}

// ResolvConf is what a sandbox container's /etc/resolv.conf is: /dev/null
// bound read-only over it, an empty file, in every network mode. A
// resolv.conf without a nameserver makes every resolver (the C library's,
// Go's, c-ares in Node.js) ask 127.0.0.1:53, where nothing listens in the
// sandbox's network namespace: the query is refused by the kernel and the
// lookup fails at once. The engine's own resolv.conf would send lookups to
// its embedded resolver (127.0.0.11) on an internal network, which, when
// every upstream refuses, does not answer at all (Docker 20.10 drops the
// query), so each lookup waited out the C library's timeouts: 10 s in
// Python and Node.js, 20 s in getent. The sandbox needs no DNS: the egress
// proxy resolves the names it is asked to tunnel to.
const ResolvConf = "/dev/null"

// ContainerSpec builds the options that create a sandbox container. It is
// pure: the container's hardening lives here, in one place, and is tested
// field by field.
//
// The container runs the agent (under the engine's init, which reaps orphans)
// with its stdin open past any one attach stream (StdinOnce false): a server
// that dies (kill -9, a crash) leaves the agent running on its lease, and a
// server started again attaches anew to the same stdin and takes the agent
// over (agentproto.KindResume). A server that ends a sandbox on purpose
// removes its container (closing the attach's stdin does so too, see
// attachStdin); an agent whose server is gone for good ends itself when its
// lease runs out, and the engine removes the container (AutoRemove).
//
// The init and the agent, which hold the stream, run as root with CAP_SETUID
// and CAP_SETGID only (ContainerUser, ContainerCapAdd); the agent keeps uid 0
// as its real and saved uid, takes the sandbox user (UID:GID, passed as
// -user) as its effective ids, and starts every command as that user with
// no capability at all. So the sandboxed code can neither signal, trace nor
// open the /proc files of the processes that hold the stream.
func ContainerSpec(p ContainerParams) client.ContainerCreateOptions {
	yes := true
	wsOpts := fmt.Sprintf("rw,exec,nosuid,nodev,size=%d,uid=%d,gid=%d,mode=0755", p.WorkspaceBytes, p.UID, p.GID)
	if p.WorkspaceReadOnly {
		wsOpts = fmt.Sprintf("ro,exec,nosuid,nodev,size=%d,uid=%d,gid=%d,mode=0755", p.WorkspaceBytes, p.UID, p.GID)
	}
	netMode := p.Network
	if netMode == "" {
		netMode = "none"
	}
	pids := p.Pids
	cfg := &container.Config{
		Hostname:     "sandbox",
		User:         ContainerUser,
		Env:          append([]string(nil), p.Env...),
		Entrypoint:   []string{AgentPath},
		Cmd:          []string{fmt.Sprintf("-user=%d:%d", p.UID, p.GID)},
		WorkingDir:   WorkspaceDir,
		Labels:       maps.Clone(p.Labels),
		Image:        p.Image,
		AttachStdin:  true,
		AttachStdout: true,
		AttachStderr: true,
		OpenStdin:    true,
		StdinOnce:    false,
		StopTimeout:  new(1),
	}
	host := &container.HostConfig{
		// The protocol runs over stdout: nothing is logged by the engine.
		LogConfig:      container.LogConfig{Type: "none"},
		NetworkMode:    container.NetworkMode(netMode),
		AutoRemove:     true,
		CapDrop:        []string{"ALL"},
		CapAdd:         ContainerCapAdd(),
		SecurityOpt:    securityOpts(p.SeccompProfile),
		ReadonlyRootfs: true,
		Init:           &yes,
		Runtime:        p.Runtime,
		IpcMode:        container.IPCModePrivate,
		DNS:            append([]netip.Addr(nil), p.DNS...),
		Mounts: []mount.Mount{
			{Type: mount.TypeBind, Source: ResolvConf, Target: "/etc/resolv.conf", ReadOnly: true},
		},
		Tmpfs: map[string]string{
			WorkspaceDir: wsOpts,
			"/tmp":       fmt.Sprintf("rw,exec,nosuid,nodev,size=%d,mode=1777", p.TmpBytes),
		},
		Resources: container.Resources{
			Memory:     p.Memory,
			MemorySwap: p.Memory,
			NanoCPUs:   p.NanoCPUs,
			PidsLimit:  &pids,
			Ulimits: []*container.Ulimit{
				{Name: "nofile", Soft: p.NoFile, Hard: p.NoFile},
			},
		},
	}
	if p.WorkspaceInImage {
		delete(host.Tmpfs, WorkspaceDir)
	}
	if p.AgentMount != "" {
		host.Mounts = append(host.Mounts, agentMounts(p.AgentMount)...)
	}
	var netCfg *network.NetworkingConfig
	if netMode != "none" {
		ep := &network.EndpointSettings{}
		if p.NetworkAddr.IsValid() {
			ep.IPAMConfig = &network.EndpointIPAMConfig{IPv4Address: p.NetworkAddr}
		}
		netCfg = &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{netMode: ep}}
	}
	return client.ContainerCreateOptions{
		Name:             p.Name,
		Config:           cfg,
		HostConfig:       host,
		NetworkingConfig: netCfg,
	}
}

// agentMounts bind-mounts the agent at path, read-only, at AgentPath.
func agentMounts(path string) []mount.Mount {
	return []mount.Mount{{Type: mount.TypeBind, Source: path, Target: AgentPath, ReadOnly: true}}
}

// securityOpts are the container's security options: no-new-privileges,
// and the operator's seccomp profile if there is one (the engine takes the
// profile's JSON itself, as the docker CLI sends it).
func securityOpts(seccompProfile string) []string {
	opts := []string{"no-new-privileges=true"}
	if seccompProfile != "" {
		opts = append(opts, "seccomp="+seccompProfile)
	}
	return opts
}
