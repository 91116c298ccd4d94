package kube

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestPodProblems: the pod Pod builds has none, and each weakening an
// admission webhook or a hand edit could make is named.
func TestPodProblems(t *testing.T) {
	if p := PodProblems(Pod(testParams())); len(p) != 0 {
		t.Fatalf("the pod Pod builds has problems: %q", p)
	}
	yes, no, root := true, false, int64(0)
	for _, c := range []struct {
		name  string
		weak  func(*corev1.Pod)
		found string
	}{
		{"token", func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = &yes }, "service-account token"},
		{"projected token", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}})
		}, "volume kube-api-access carries a token"},
		{"host path", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}, "volume h is a host path"},
		{"service links", func(p *corev1.Pod) { p.Spec.EnableServiceLinks = nil }, "service links"},
		{"host network", func(p *corev1.Pod) { p.Spec.HostNetwork = true }, "node namespace"},
		{"restarts", func(p *corev1.Pod) { p.Spec.RestartPolicy = corev1.RestartPolicyAlways }, "restart policy"},
		{"root", func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.RunAsUser = &root }, "container sandbox may run as root"},
		{"escalation", func(p *corev1.Pod) { p.Spec.InitContainers[0].SecurityContext.AllowPrivilegeEscalation = &yes }, "container agent allows privilege escalation"},
		{"privileged", func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.Privileged = &yes }, "is privileged"},
		{"writable root", func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem = &no }, "writable root filesystem"},
		{"capability", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_RAW"}
		}, "does not drop every capability"},
		{"seccomp", func(p *corev1.Pod) {
			p.Spec.SecurityContext.SeccompProfile = nil
			p.Spec.Containers[0].SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		}, "neither the RuntimeDefault seccomp profile nor a node-local one"},
		{"no memory limit", func(p *corev1.Pod) { delete(p.Spec.Containers[0].Resources.Limits, corev1.ResourceMemory) }, "lacks a memory"},
		{"agent writable", func(p *corev1.Pod) {
			for i := range p.Spec.Containers[0].VolumeMounts {
				p.Spec.Containers[0].VolumeMounts[i].ReadOnly = false
			}
		}, "can write the agent's volume"},
		{"workspace on disk", func(p *corev1.Pod) {
			for i, v := range p.Spec.Volumes {
				if v.Name == "workspace" {
					p.Spec.Volumes[i].EmptyDir = &corev1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(1, resource.BinarySI)}
				}
			}
		}, "volume workspace is not a size-limited emptyDir in memory"},
		{"sidecar", func(p *corev1.Pod) { p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "x"}) }, "2 containers"},
	} {
		pod := Pod(testParams())
		c.weak(pod)
		got := strings.Join(PodProblems(pod), "; ")
		if !strings.Contains(got, c.found) {
			t.Errorf("%s: problems %q, want one naming %q", c.name, got, c.found)
		}
	}
}

// TestPodSeccompLocalhost: a node-local profile replaces RuntimeDefault on
// the sandbox container only (the agent installer keeps the runtime's), and
// the pod is still hardened.
func TestPodSeccompLocalhost(t *testing.T) {
	p := testParams()
	p.SeccompLocalhost = "sandbox-mcp/no-io_uring.json"
	pod := Pod(p)
	sp := pod.Spec.Containers[0].SecurityContext.SeccompProfile
	if sp == nil || sp.Type != corev1.SeccompProfileTypeLocalhost || sp.LocalhostProfile == nil || *sp.LocalhostProfile != p.SeccompLocalhost {
		t.Fatalf("sandbox container's seccomp: %+v", sp)
	}
	if ip := pod.Spec.InitContainers[0].SecurityContext.SeccompProfile; ip.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("agent installer's seccomp: %+v", ip)
	}
	if probs := PodProblems(pod); len(probs) != 0 {
		t.Errorf("a pod with a node-local profile: %q", probs)
	}
	empty := ""
	pod.Spec.Containers[0].SecurityContext.SeccompProfile.LocalhostProfile = &empty
	if probs := PodProblems(pod); len(probs) != 1 {
		t.Errorf("a Localhost profile without a path: %q, want one problem", probs)
	}
}
