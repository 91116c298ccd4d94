package kube

import (
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

func testParams() Params {
	cfg := Config{Namespace: "ns", Instance: "srv-test", AgentImage: "agent:1"}
	return cfg.complete(Params{
		Name: "sandbox-mcp-sb-1-1", Image: "img:1", UID: 1000, GID: 1000,
		Env:            []string{"A=1", "HTTP_PROXY=http://sbx:t@10.0.0.1:3128", "EMPTY="},
		WorkspaceBytes: 256 << 20, TmpBytes: 64 << 20, Memory: 512 << 20, NanoCPUs: 1_500_000_000,
	}, "sb-1", "host/1", time.Unix(0, 0))
}

// TestCompleteParams: the one completion of Params takes the cluster's
// configuration where the Params leave a field empty, keeps what they
// set, always puts the pod in the configured namespace with this server's
// labels, fills the zero values' defaults, and leaves the caller's maps
// alone.
func TestCompleteParams(t *testing.T) {
	cfg := Config{Namespace: "ns", Instance: "srv-a", AgentImage: "agent:cfg", PullPolicy: corev1.PullNever,
		RuntimeClass: "gvisor", SeccompLocalhost: "sandbox-mcp/p.json"}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	labels := map[string]string{"extra": "1", LabelInstance: "srv-other"}
	p := cfg.complete(Params{Name: "pod", Namespace: "elsewhere", Labels: labels}, "sb-1", "host/42", now)
	if p.Namespace != "ns" || p.AgentImage != "agent:cfg" || p.PullPolicy != corev1.PullNever ||
		p.RuntimeClass != "gvisor" || p.SeccompLocalhost != "sandbox-mcp/p.json" || p.EphemeralBytes != DefaultEphemeralBytes {
		t.Errorf("from the config: %+v", p)
	}
	want := map[string]string{"extra": "1", LabelManaged: "1", LabelInstance: "srv-a", LabelSandbox: "sb-1", LabelRole: "sandbox"}
	if !maps.Equal(p.Labels, want) {
		t.Errorf("labels %v, want %v", p.Labels, want)
	}
	if len(labels) != 2 || labels[LabelInstance] != "srv-other" {
		t.Errorf("the caller's labels changed: %v", labels)
	}
	if p.Annotations[AnnotationOwner] != "host/42" || p.Annotations[AnnotationCreated] != "2026-01-02T02:04:05Z" {
		t.Errorf("annotations %v", p.Annotations)
	}

	// What the Params set wins; an empty config gives the defaults.
	p = cfg.complete(Params{AgentImage: "agent:own", PullPolicy: corev1.PullAlways, RuntimeClass: "kata",
		SeccompLocalhost: "own.json", EphemeralBytes: 1 << 30}, "sb-2", "h", now)
	if p.AgentImage != "agent:own" || p.PullPolicy != corev1.PullAlways || p.RuntimeClass != "kata" ||
		p.SeccompLocalhost != "own.json" || p.EphemeralBytes != 1<<30 {
		t.Errorf("explicit fields: %+v", p)
	}
	if p = (Config{}).complete(Params{}, "sb", "h", now); p.PullPolicy != corev1.PullIfNotPresent || p.EphemeralBytes != DefaultEphemeralBytes {
		t.Errorf("defaults: pull %q ephemeral %d", p.PullPolicy, p.EphemeralBytes)
	}
	pod := Pod(p)
	if got := pod.Spec.Containers[0].ImagePullPolicy; got != corev1.PullIfNotPresent {
		t.Errorf("pod pull policy %q", got)
	}
}

// restrictedProblems checks a container against the Pod Security
// "restricted" profile's container rules and the sandbox's own.
func restrictedProblems(t *testing.T, pod *corev1.Pod, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil {
		t.Fatalf("%s: no security context", c.Name)
	}
	ps := pod.Spec.SecurityContext
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: privilege escalation allowed", c.Name)
	}
	if sc.Privileged == nil || *sc.Privileged {
		t.Errorf("%s: privileged", c.Name)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("%s: capabilities %+v, want drop ALL and add none", c.Name, sc.Capabilities)
	}
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("%s: may run as root", c.Name)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: writable root filesystem", c.Name)
	}
	if (sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault) &&
		(ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault) {
		t.Errorf("%s: no RuntimeDefault seccomp", c.Name)
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceMemory, corev1.ResourceCPU, corev1.ResourceEphemeralStorage} {
		if q, ok := c.Resources.Limits[r]; !ok || q.IsZero() {
			t.Errorf("%s: no %s limit", c.Name, r)
		}
	}
	if len(c.Ports) != 0 {
		t.Errorf("%s: ports %v", c.Name, c.Ports)
	}
}

func TestPodHardened(t *testing.T) {
	pod := Pod(testParams())
	s := pod.Spec
	if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
		t.Error("the service-account token is mounted")
	}
	if s.EnableServiceLinks == nil || *s.EnableServiceLinks {
		t.Error("service links are on")
	}
	if s.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restart policy %q, want Never", s.RestartPolicy)
	}
	if s.HostNetwork || s.HostPID || s.HostIPC || s.ShareProcessNamespace != nil {
		t.Error("the pod shares a host namespace or its process namespace")
	}
	if ps := s.SecurityContext; ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || *ps.RunAsUser != 1000 || *ps.RunAsGroup != 1000 {
		t.Errorf("pod security context %+v", ps)
	}
	if len(s.InitContainers) != 1 || len(s.Containers) != 1 {
		t.Fatalf("containers: %d init, %d, want 1 and 1", len(s.InitContainers), len(s.Containers))
	}
	for _, c := range append(s.InitContainers, s.Containers...) {
		restrictedProblems(t, pod, c)
	}
	for _, v := range s.Volumes {
		if v.EmptyDir == nil {
			t.Errorf("volume %s is not an emptyDir: %+v", v.Name, v.VolumeSource)
		} else if v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.IsZero() {
			t.Errorf("volume %s has no size limit", v.Name)
		}
	}
	if s.RuntimeClassName != nil {
		t.Errorf("runtime class %q without one asked", *s.RuntimeClassName)
	}
	if s.TerminationGracePeriodSeconds == nil || *s.TerminationGracePeriodSeconds > 1 {
		t.Error("a sandbox pod should end at once")
	}
}

func TestPodFields(t *testing.T) {
	p := testParams()
	p.RuntimeClass = "gvisor"
	p.PullPolicy = corev1.PullNever
	pod := Pod(p)
	sb := pod.Spec.Containers[0]
	if sb.Name != SandboxContainer || sb.Image != "img:1" || sb.ImagePullPolicy != corev1.PullNever {
		t.Errorf("sandbox container %s image %s pull %s", sb.Name, sb.Image, sb.ImagePullPolicy)
	}
	if !slices.Equal(sb.Command, []string{AgentPath, "hub", "-user=1000:1000", "-unprivileged"}) || sb.WorkingDir != WorkspaceDir {
		t.Errorf("sandbox command %q in %s", sb.Command, sb.WorkingDir)
	}
	if got := sb.Resources.Limits.Memory().Value(); got != 512<<20 {
		t.Errorf("memory limit %d", got)
	}
	if got := sb.Resources.Limits.Cpu().MilliValue(); got != 1500 {
		t.Errorf("cpu limit %dm, want 1500m", got)
	}
	if got := sb.Resources.Requests.Cpu().MilliValue(); got != 375 {
		t.Errorf("cpu request %dm, want a quarter of the limit", got)
	}
	if sb.Resources.Requests.Memory().Value() != 512<<20 {
		t.Error("memory request is not the limit")
	}
	if got := sb.Resources.Limits.StorageEphemeral().Value(); got != DefaultEphemeralBytes {
		t.Errorf("ephemeral limit %d", got)
	}
	if dns := pod.Spec.DNSConfig; pod.Spec.DNSPolicy != corev1.DNSNone || dns == nil || !slices.Equal(dns.Nameservers, []string{"127.0.0.1"}) || len(dns.Searches) != 0 {
		t.Errorf("dns policy %s config %+v: want no cluster DNS, loopback only (lookups refused at once)", pod.Spec.DNSPolicy, dns)
	}
	want := []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "HTTP_PROXY", Value: "http://sbx:t@10.0.0.1:3128"}, {Name: "EMPTY"}}
	if !slices.Equal(sb.Env, want) {
		t.Errorf("env %+v", sb.Env)
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	if ws := vols["workspace"].EmptyDir; ws == nil || ws.Medium != corev1.StorageMediumMemory || ws.SizeLimit.Value() != 256<<20 {
		t.Errorf("workspace volume %+v", ws)
	}
	if tmp := vols["tmp"].EmptyDir; tmp == nil || tmp.Medium != corev1.StorageMediumMemory || tmp.SizeLimit.Value() != 64<<20 {
		t.Errorf("tmp volume %+v", tmp)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range sb.VolumeMounts {
		mounts[m.MountPath] = m
	}
	if m := mounts[AgentDir]; m.Name != "agent" || !m.ReadOnly {
		t.Errorf("the agent volume is not mounted read-only at %s: %+v", AgentDir, m)
	}
	if m := mounts[WorkspaceDir]; m.Name != "workspace" || m.ReadOnly {
		t.Errorf("workspace mount %+v", m)
	}
	in := pod.Spec.InitContainers[0]
	if in.Image != "agent:1" || !slices.Equal(in.Command, []string{AgentImagePath, "install", AgentPath}) {
		t.Errorf("init container %s %q", in.Image, in.Command)
	}
	if pod.Spec.RuntimeClassName == nil || *pod.Spec.RuntimeClassName != "gvisor" {
		t.Error("runtime class not set")
	}
	if pod.Labels[LabelManaged] != "1" {
		t.Error("labels lost")
	}
	// The pod's maps are its own.
	p.Labels["x"] = "y"
	if _, ok := pod.Labels["x"]; ok {
		t.Error("Pod shares the caller's label map")
	}
	p.ReadOnly = true
	for _, m := range Pod(p).Spec.Containers[0].VolumeMounts {
		if m.MountPath == WorkspaceDir && !m.ReadOnly {
			t.Error("ReadOnly does not mount the workspace read-only")
		}
	}
	if got := HubCommand(1000, 1001); !slices.Equal(got, []string{AgentPath, "hub", "-user=1000:1001", "-unprivileged"}) {
		t.Errorf("agent command %q", got)
	}
}

func TestPodStarted(t *testing.T) {
	pod := func(mod func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{}
		p.Name = "p"
		p.Status.Phase = corev1.PodPending
		mod(p)
		return p
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		done bool
		err  string
	}{
		{"pending", pod(func(*corev1.Pod) {}), false, ""},
		{"running", pod(func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: SandboxContainer, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
		}), true, ""},
		{"unschedulable", pod(func(p *corev1.Pod) {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes: Insufficient memory"}}
		}), false, "Insufficient memory"},
		{"image missing", pod(func(p *corev1.Pod) {
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: AgentContainer, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImageNeverPull", Message: "not present"}}}}
		}), false, "ErrImageNeverPull"},
		{"sandbox image missing", pod(func(p *corev1.Pod) {
			p.Spec.Containers = []corev1.Container{{Name: SandboxContainer, Image: "tpl:1"}}
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: SandboxContainer, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImageNeverPull", Message: "not present"}}}}
		}), false, "image tpl:1 is not on the node"},
		{"image pulling", pod(func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: SandboxContainer, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}
		}), false, ""},
		{"init failed", pod(func(p *corev1.Pod) {
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: AgentContainer, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}}}}
		}), false, "exit 1"},
		{"failed", pod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }), false, "ended"},
	} {
		done, err := podStarted(tc.pod)
		if done != tc.done || (err == nil) != (tc.err == "") || (err != nil && !contains(err.Error(), tc.err)) {
			t.Errorf("%s: done %v err %v, want %v and %q", tc.name, done, err, tc.done, tc.err)
		}
		if err != nil && !isUnavailable(err) {
			t.Errorf("%s: %v is not UNAVAILABLE", tc.name, err)
		}
		// The sandbox container's image (a template's) is one the
		// session names the template for; the agent image is not.
		var im *backend.ImageMissingError
		if got, want := errors.As(err, &im), tc.name == "sandbox image missing"; got != want || got && im.Image != "tpl:1" {
			t.Errorf("%s: %v is an ImageMissingError: %v, want %v", tc.name, err, got, want)
		}
	}
}

func TestNetworkPolicyShapes(t *testing.T) {
	iso := IsolationPolicy("ns")
	if len(iso.Spec.Ingress) != 0 || len(iso.Spec.Egress) != 0 || len(iso.Spec.PolicyTypes) != 2 {
		t.Errorf("isolation policy allows something: %+v", iso.Spec)
	}
	if iso.Spec.PodSelector.MatchLabels[LabelRole] != "sandbox" {
		t.Errorf("isolation policy selects %v", iso.Spec.PodSelector.MatchLabels)
	}
	pp := ProxyPolicy("ns", "srv-1", Proxy{Port: 3128, CIDR: "10.0.0.1/32"})
	sel := pp.Spec.PodSelector.MatchLabels
	if sel[LabelInstance] != "srv-1" || sel[LabelNetwork] != NetworkProxy {
		t.Errorf("proxy policy selects %v", sel)
	}
	if len(pp.Spec.Egress) != 1 || len(pp.Spec.Egress[0].To) != 1 || pp.Spec.Egress[0].To[0].IPBlock.CIDR != "10.0.0.1/32" ||
		len(pp.Spec.Egress[0].Ports) != 1 || pp.Spec.Egress[0].Ports[0].Port.IntValue() != 3128 {
		t.Errorf("proxy policy egress %+v", pp.Spec.Egress)
	}
	if len(pp.Spec.Ingress) != 0 {
		t.Error("proxy policy allows ingress")
	}
	p := testParams()
	if Pod(p).Labels[LabelNetwork] != NetworkNone {
		t.Error("a pod without a network mode is not on NetworkNone")
	}
	p.Network = NetworkProxy
	if Pod(p).Labels[LabelNetwork] != NetworkProxy {
		t.Error("network label not set")
	}
}
