package kube

import (
	"fmt"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Paths and names inside every sandbox pod.
const (
	// WorkspaceDir is the sandbox's workspace, an emptyDir in memory.
	WorkspaceDir = "/workspace"
	// AgentDir is where the sandbox container sees the agent volume.
	AgentDir = "/.sandbox-mcp"
	// AgentPath is the agent inside the sandbox container.
	AgentPath = AgentDir + "/sandbox-agent"
	// AgentImagePath is the agent inside the agent image.
	AgentImagePath = "/sandbox-agent"

	// SandboxContainer and AgentContainer name the pod's containers.
	SandboxContainer = "sandbox"
	AgentContainer   = "agent"

	// AgentVolumeBytes bounds the agent volume (the static agent is ~10 MB).
	AgentVolumeBytes = 64 << 20
	// DefaultEphemeralBytes bounds what the pod may write to the node's
	// disk outside its memory volumes: the agent volume and the kubelet's
	// bookkeeping (the root filesystem is read-only, the container logs
	// stay empty).
	DefaultEphemeralBytes = 128 << 20
	// CPURequestShare divides a sandbox's CPU limit into its CPU request.
	CPURequestShare = 4
)

// Labels put on every object the backend makes. They are valid label keys
// and have the same names as the Docker backend's.
const (
	LabelManaged  = "io.sandbox-mcp"          // "1"
	LabelInstance = "io.sandbox-mcp.instance" // the server instance (its Lease's name)
	LabelSandbox  = "io.sandbox-mcp.sandbox"  // the sandbox id
	LabelRole     = "io.sandbox-mcp.role"     // "sandbox" on sandbox pods
	// AnnotationOwner records the server process that made the pod:
	// hostname, pid and start time, as the Docker backend's labels do.
	AnnotationOwner = "sandbox-mcp.io/owner"
	// AnnotationCreated is the pod's creation time by the server (RFC 3339).
	AnnotationCreated = "sandbox-mcp.io/created"
)

// Params are the inputs of Pod. Every field comes from the server's options
// and policy; nothing here comes from a tool argument. Config.complete fills
// in those the cluster's configuration gives and the defaults of the zero
// values, in one place, before Pod.
type Params struct {
	Name       string // pod name (a DNS label)
	Namespace  string
	Image      string // the sandbox image, any image the cluster can run
	AgentImage string // the agent image (FROM scratch + static sandbox-agent)
	// PullPolicy for both images; "" means IfNotPresent.
	PullPolicy corev1.PullPolicy

	Labels      map[string]string // LabelManaged and friends included
	Annotations map[string]string

	UID, GID int // the non-root user everything in the pod runs as
	// Env goes into the sandbox container's spec (NAME=VALUE), where anyone
	// who may get pods reads it and etcd stores it: the Backend puts none of
	// the sandbox's environment here (the agent's setup delivers it).
	Env []string

	WorkspaceBytes int64 // sizeLimit of the /workspace emptyDir (memory)
	TmpBytes       int64 // sizeLimit of the /tmp emptyDir (memory)
	ReadOnly       bool  // mount /workspace read-only
	Memory         int64 // memory limit (and request), bytes
	NanoCPUs       int64 // CPU limit (and request), 1e-9 CPUs
	// EphemeralBytes is the ephemeral-storage limit; 0 means
	// DefaultEphemeralBytes.
	EphemeralBytes int64
	// Network is NetworkNone (no traffic in or out) or NetworkProxy (out to
	// the server's proxy only); "" means NetworkNone. The NetworkPolicies
	// select pods by it.
	Network string
	// SeccompLocalhost, if set, is the sandbox container's seccomp profile:
	// a file under the kubelet's seccomp directory on every node, in place
	// of the runtime's default (RuntimeDefault). Pod Security "restricted"
	// admits both.
	SeccompLocalhost string
	// RuntimeClass is the pod's runtimeClassName ("" for the cluster's
	// default; "gvisor", "kata" where the cluster offers them).
	RuntimeClass string
}

// Pod builds the sandbox pod from p as it is: Config.complete fills in
// what p takes from the configuration and the defaults. It is pure.
//
// Both containers satisfy Pod Security "restricted": non-root numeric user,
// no privilege escalation, every capability dropped, RuntimeDefault seccomp,
// read-only root filesystem. The pod mounts no service-account token, gets
// no service links, and never restarts: a sandbox that ends is gone, and the
// server recovers it from a snapshot.
func Pod(p Params) *corev1.Pod {
	no, yes := false, true
	uid, gid := int64(p.UID), int64(p.GID)
	grace := int64(1)
	pull, eph := p.PullPolicy, p.EphemeralBytes
	sc := func() *corev1.SecurityContext {
		return &corev1.SecurityContext{
			RunAsUser:                &uid,
			RunAsGroup:               &gid,
			RunAsNonRoot:             &yes,
			AllowPrivilegeEscalation: &no,
			Privileged:               &no,
			ReadOnlyRootFilesystem:   &yes,
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		}
	}
	limits := corev1.ResourceList{
		corev1.ResourceMemory:           *resource.NewQuantity(p.Memory, resource.BinarySI),
		corev1.ResourceCPU:              *resource.NewMilliQuantity(max(p.NanoCPUs/1_000_000, 1), resource.DecimalSI),
		corev1.ResourceEphemeralStorage: *resource.NewQuantity(eph, resource.BinarySI),
	}
	// Memory and storage are reserved whole (they cannot be taken back);
	// CPU is reserved at CPURequestShare of the limit, since sandboxes sit
	// idle most of the time: a node runs more of them, and each may still
	// burst to its limit.
	requests := limits.DeepCopy()
	requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(max(p.NanoCPUs/1_000_000/CPURequestShare, 1), resource.DecimalSI)
	memDir := func(size int64) corev1.VolumeSource {
		return corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
			Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity(size, resource.BinarySI)}}
	}
	initLimits := corev1.ResourceList{
		corev1.ResourceMemory:           resource.MustParse("32Mi"),
		corev1.ResourceCPU:              resource.MustParse("100m"),
		corev1.ResourceEphemeralStorage: *resource.NewQuantity(AgentVolumeBytes, resource.BinarySI),
	}
	labels := maps.Clone(p.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelNetwork] = NetworkNone
	if p.Network == NetworkProxy {
		labels[LabelNetwork] = NetworkProxy
	}
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        p.Name,
			Namespace:   p.Namespace,
			Labels:      labels,
			Annotations: maps.Clone(p.Annotations),
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			TerminationGracePeriodSeconds: &grace,
			Hostname:                      "sandbox",
			// No cluster DNS: the egress proxy resolves what it tunnels
			// to, and the NetworkPolicies drop packets to the cluster's
			// resolver, so each lookup would wait out the C library's
			// timeouts (10-20 s). Loopback, where nothing listens, refuses
			// every query at once (see docker.ResolvConf).
			DNSPolicy: corev1.DNSNone,
			DNSConfig: &corev1.PodDNSConfig{Nameservers: []string{"127.0.0.1"}},
			SecurityContext: &corev1.PodSecurityContext{
				RunAsUser:      &uid,
				RunAsGroup:     &gid,
				RunAsNonRoot:   &yes,
				FSGroup:        &gid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			InitContainers: []corev1.Container{{
				Name:                     AgentContainer,
				Image:                    p.AgentImage,
				ImagePullPolicy:          pull,
				Command:                  []string{AgentImagePath, "install", AgentPath},
				SecurityContext:          sc(),
				Resources:                corev1.ResourceRequirements{Limits: initLimits, Requests: initLimits},
				VolumeMounts:             []corev1.VolumeMount{{Name: "agent", MountPath: AgentDir}},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
			Containers: []corev1.Container{{
				Name:            SandboxContainer,
				Image:           p.Image,
				ImagePullPolicy: pull,
				Command:         HubCommand(p.UID, p.GID),
				WorkingDir:      WorkspaceDir,
				Env:             envVars(p.Env),
				SecurityContext: sc(),
				Resources:       corev1.ResourceRequirements{Limits: limits, Requests: requests},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "workspace", MountPath: WorkspaceDir, ReadOnly: p.ReadOnly},
					{Name: "tmp", MountPath: "/tmp"},
					{Name: "agent", MountPath: AgentDir, ReadOnly: true},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "workspace", VolumeSource: memDir(p.WorkspaceBytes)},
				{Name: "tmp", VolumeSource: memDir(p.TmpBytes)},
				{Name: "agent", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
					SizeLimit: resource.NewQuantity(AgentVolumeBytes, resource.BinarySI)}}},
			},
		},
	}
	if p.RuntimeClass != "" {
		rc := p.RuntimeClass
		pod.Spec.RuntimeClassName = &rc
	}
	if p.SeccompLocalhost != "" {
		path := p.SeccompLocalhost
		pod.Spec.Containers[0].SecurityContext.SeccompProfile = &corev1.SeccompProfile{
			Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: &path}
	}
	return pod
}

// HubCommand is the sandbox container's main process: the agent's hub
// (sandbox-agent hub), which runs the agent as the pod's user,
// unprivileged, ends the pod with it, and lends the agent's stream to one
// attach at a time (AttachCommand), so that any server can take the
// sandbox over.
func HubCommand(uid, gid int) []string {
	return []string{AgentPath, "hub", fmt.Sprintf("-user=%d:%d", uid, gid), "-unprivileged"}
}

// AttachCommand is what the server execs in the sandbox container to reach
// the agent: its stdin and stdout are the agent's protocol stream. A newer
// attach supersedes it (it then exits with ExitSuperseded).
func AttachCommand() []string { return []string{AgentPath, "attach"} }

// ExitSuperseded is an attach's exit code when a newer one took the
// agent's stream (sandbox-agent's ExitSuperseded).
const ExitSuperseded = 3

// envVars turns NAME=VALUE pairs into the pod's env list, in order.
func envVars(env []string) []corev1.EnvVar {
	out := make([]corev1.EnvVar, 0, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		out = append(out, corev1.EnvVar{Name: k, Value: v})
	}
	return out
}

// complete returns p with what it takes from the cluster's configuration
// (namespace, agent image, pull policy, runtime class, seccomp profile),
// the labels that make the pod this server's sandbox's, the owner
// annotations, and the defaults of the zero values (PullPolicy
// IfNotPresent, EphemeralBytes DefaultEphemeralBytes). It is the one place
// Params are completed, and is pure: owner and now are given, and p's maps
// are copied, not changed.
func (cfg Config) complete(p Params, sandbox, owner string, now time.Time) Params {
	p.Namespace = cfg.Namespace
	if p.AgentImage == "" {
		p.AgentImage = cfg.AgentImage
	}
	if p.PullPolicy == "" {
		p.PullPolicy = cfg.PullPolicy
	}
	if p.PullPolicy == "" {
		p.PullPolicy = corev1.PullIfNotPresent
	}
	if p.SeccompLocalhost == "" {
		p.SeccompLocalhost = cfg.SeccompLocalhost
	}
	if p.RuntimeClass == "" {
		p.RuntimeClass = cfg.RuntimeClass
	}
	if p.EphemeralBytes == 0 {
		p.EphemeralBytes = DefaultEphemeralBytes
	}
	p.Labels = maps.Clone(p.Labels)
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	p.Labels[LabelManaged] = "1"
	p.Labels[LabelInstance] = cfg.Instance
	p.Labels[LabelSandbox] = sandbox
	p.Labels[LabelRole] = "sandbox"
	p.Annotations = maps.Clone(p.Annotations)
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[AnnotationOwner] = owner
	p.Annotations[AnnotationCreated] = now.UTC().Format(time.RFC3339)
	return p
}
