package kube

import (
	"context"
	"fmt"
	"strings"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodProblems compares a sandbox pod, as the API server returns it, with the
// hardening Pod asks for, and returns one sentence per difference (none when
// the pod is hardened). It is what `sandbox-mcp doctor` reports for a pod an
// admission webhook or a mutating policy may have changed on its way in.
func PodProblems(p *corev1.Pod) []string {
	var out []string
	check := func(ok bool, format string, a ...any) {
		if !ok {
			out = append(out, fmt.Sprintf(format, a...))
		}
	}
	s := p.Spec
	check(s.AutomountServiceAccountToken != nil && !*s.AutomountServiceAccountToken, "the pod may mount a service-account token")
	for _, v := range s.Volumes {
		check(v.Projected == nil && v.Secret == nil, "volume %s carries a token or a Secret", v.Name)
		check(v.HostPath == nil, "volume %s is a host path", v.Name)
	}
	check(s.EnableServiceLinks != nil && !*s.EnableServiceLinks, "service links are on (every Service's address in the environment)")
	check(!s.HostNetwork && !s.HostPID && !s.HostIPC, "the pod shares a node namespace")
	check(s.RestartPolicy == corev1.RestartPolicyNever, "restart policy %q, want Never", s.RestartPolicy)
	psc := s.SecurityContext
	check(psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot, "the pod does not require a non-root user")
	if len(s.Containers) != 1 || len(s.InitContainers) != 1 {
		return append(out, fmt.Sprintf("the pod has %d containers and %d init containers, want the sandbox and the agent installer", len(s.Containers), len(s.InitContainers)))
	}
	for _, c := range append(s.InitContainers[:1:1], s.Containers...) {
		sc := c.SecurityContext
		if sc == nil {
			out = append(out, fmt.Sprintf("container %s has no security context", c.Name))
			continue
		}
		check(sc.RunAsUser != nil && *sc.RunAsUser > 0, "container %s may run as root", c.Name)
		check(sc.RunAsNonRoot != nil && *sc.RunAsNonRoot, "container %s does not require a non-root user", c.Name)
		check(sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation, "container %s allows privilege escalation", c.Name)
		check(sc.Privileged == nil || !*sc.Privileged, "container %s is privileged", c.Name)
		check(sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem, "container %s has a writable root filesystem", c.Name)
		check(sc.Capabilities != nil && len(sc.Capabilities.Add) == 0 && len(sc.Capabilities.Drop) == 1 && sc.Capabilities.Drop[0] == "ALL",
			"container %s does not drop every capability (%v)", c.Name, sc.Capabilities)
		seccomp := sc.SeccompProfile
		if seccomp == nil && psc != nil {
			seccomp = psc.SeccompProfile
		}
		check(seccomp != nil && (seccomp.Type == corev1.SeccompProfileTypeRuntimeDefault ||
			seccomp.Type == corev1.SeccompProfileTypeLocalhost && seccomp.LocalhostProfile != nil && *seccomp.LocalhostProfile != ""),
			"container %s runs under neither the RuntimeDefault seccomp profile nor a node-local one", c.Name)
		lim := c.Resources.Limits
		check(!lim.Memory().IsZero() && !lim.Cpu().IsZero() && !lim.StorageEphemeral().IsZero(), "container %s lacks a memory, CPU or ephemeral-storage limit", c.Name)
	}
	sandbox := s.Containers[0]
	for _, m := range sandbox.VolumeMounts {
		if m.MountPath == AgentDir {
			check(m.ReadOnly, "the sandbox container can write the agent's volume")
		}
	}
	for _, v := range s.Volumes {
		if v.Name == "workspace" || v.Name == "tmp" {
			ok := v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory && v.EmptyDir.SizeLimit != nil && !v.EmptyDir.SizeLimit.IsZero()
			check(ok, "volume %s is not a size-limited emptyDir in memory", v.Name)
		}
	}
	return out
}

// Permission is what the server does to one kind of object in its
// namespace. Permissions lists all of it: deploy/kubernetes/rbac.yaml grants
// exactly this (a test holds them together), and doctor asks the API server
// whether the server's identity has each.
type Permission struct {
	Group, Resource, Subresource string
	Verbs                        []string
}

// Permissions is every permission the backend uses, in its namespace only.
var Permissions = []Permission{
	{Resource: "pods", Verbs: []string{"create", "get", "list", "watch", "delete", "deletecollection"}},
	{Resource: "pods", Subresource: "exec", Verbs: []string{"create", "get"}},
	{Group: "networking.k8s.io", Resource: "networkpolicies", Verbs: []string{"create", "get", "update", "delete"}},
	{Group: "coordination.k8s.io", Resource: "leases", Verbs: []string{"create", "get", "list", "update", "delete"}},
}

// MissingPermissions asks the API server, with a SelfSubjectAccessReview
// each, which of Permissions the server's identity lacks in its namespace,
// and names each one as "verb resource[/subresource]".
func (c *Cluster) MissingPermissions(ctx context.Context) ([]string, error) {
	var missing []string
	for _, p := range Permissions {
		for _, verb := range p.Verbs {
			r, err := c.cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{
				Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authzv1.ResourceAttributes{
					Namespace: c.cfg.Namespace, Verb: verb, Group: p.Group, Resource: p.Resource, Subresource: p.Subresource,
				}},
			}, metav1.CreateOptions{})
			if err != nil {
				return nil, apiError("ask the API server what this server may do", err)
			}
			if !r.Status.Allowed {
				name := p.Resource
				if p.Subresource != "" {
					name += "/" + p.Subresource
				}
				if p.Group != "" {
					name += "." + p.Group
				}
				missing = append(missing, verb+" "+name)
			}
		}
	}
	return missing, nil
}

// PodSecurityLevel returns the Pod Security level the namespace enforces
// ("" if none), and false if the namespace cannot be read: a server's Role
// cannot grant reading its own namespace, so that is not an error.
func (c *Cluster) PodSecurityLevel(ctx context.Context) (level string, readable bool, err error) {
	ns, err := c.cs.CoreV1().Namespaces().Get(ctx, c.cfg.Namespace, metav1.GetOptions{})
	if err != nil {
		switch {
		case apierrors.IsForbidden(err):
			return "", false, nil
		case apierrors.IsNotFound(err):
			return "", false, fmt.Errorf("namespace %s does not exist: create it (deploy/kubernetes/namespace.yaml makes one that enforces Pod Security restricted), or pass the right --namespace", c.cfg.Namespace)
		}
		return "", false, apiError("read namespace "+c.cfg.Namespace, err)
	}
	return strings.TrimSpace(ns.Labels["pod-security.kubernetes.io/enforce"]), true, nil
}

// Pod returns a pod of the namespace as the API server has it.
func (c *Cluster) Pod(ctx context.Context, name string) (*corev1.Pod, error) {
	p, err := c.cs.CoreV1().Pods(c.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, apiError("read pod "+name, err)
	}
	return p, nil
}
