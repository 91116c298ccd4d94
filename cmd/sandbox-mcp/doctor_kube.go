package main

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/sandbox-mcp/sandbox-mcp/session/kube"
)

// doctorKube checks the Kubernetes backend: the client configuration, the
// API server, the namespace and its Pod Security level, every permission
// the server uses there, and a real sandbox pod (its hardening as the API
// server has it, and what its commands run as, seen from inside).
func doctorKube(ctx context.Context, cfg Config, r *report) {
	quiet := slog.New(slog.DiscardHandler)
	klog.SetSlogLogger(quiet)
	k := cfg.Kube
	rc, err := kube.RESTConfig(k.Kubeconfig)
	if err != nil {
		r.fail("cluster configuration: %v", err)
		return
	}
	rc.Timeout = 10 * time.Second
	probe, err := kube.NewCluster(rc, kube.Config{Namespace: k.Namespace, Instance: "doctor"})
	if err != nil {
		r.fail("cluster client: %v", err)
		return
	}
	v, err := probe.Clientset().Discovery().ServerVersion()
	if err != nil {
		r.fail("Kubernetes API server at %s not reachable: %v; check --kubeconfig (or the pod's service account) and that the cluster is up", rc.Host, err)
		return
	}
	r.ok("Kubernetes API server %s at %s", v.GitVersion, rc.Host)

	switch level, readable, err := probe.PodSecurityLevel(ctx); {
	case err != nil:
		r.fail("%v", err)
		return
	case !readable:
		r.ok("namespace %s (its labels are not readable with these credentials; a Role cannot grant that)", k.Namespace)
	case level == "restricted":
		r.ok("namespace %s enforces Pod Security restricted", k.Namespace)
	default:
		r.warn("namespace %s enforces Pod Security %q, not restricted: label it pod-security.kubernetes.io/enforce=restricted, so that nothing less hardened than a sandbox pod can run beside them", k.Namespace, orUnknown(level))
	}

	missing, err := probe.MissingPermissions(ctx)
	switch {
	case err != nil:
		r.fail("%v", err)
		return
	case len(missing) > 0:
		r.fail("these credentials may not %s in namespace %s: grant them with a Role (deploy/kubernetes/rbac.yaml has the one the server needs)", strings.Join(missing, ", "), k.Namespace)
		return
	}
	r.ok("permissions in namespace %s: pods (create, watch, delete), pods/exec, networkpolicies, leases", k.Namespace)

	rc.Timeout = 0
	start := time.Now()
	m, release, err := newManager(ctx, cfg, quiet, nil)
	if err != nil {
		r.fail("sandbox backend: %v", err)
		return
	}
	defer release()
	defer m.Close(context.Background())
	if err := m.WaitPrepared(ctx, 0, 0, nil); err != nil {
		r.fail("sandbox backend: %v", err)
		return
	}
	r.ok("server lease and network policies in namespace %s (%s); whether the cluster's network plugin enforces NetworkPolicies cannot be seen from its API: use one that does (Calico, Cilium, kube-router…)",
		k.Namespace, time.Since(start).Round(time.Millisecond))
	sb := checkSandbox(ctx, m, r, kube.AgentPath, kubeSeccomp(k.SeccompLocalhost), "pod start included: scheduling, the agent image's init container, the exec stream")
	if sb == nil {
		return
	}
	pod, err := probe.Pod(ctx, sb.ContainerID())
	if err != nil {
		r.fail("%v", err)
	} else if p := kube.PodProblems(pod); len(p) > 0 {
		for _, msg := range p {
			r.fail("sandbox pod hardening: %s", msg)
		}
	} else {
		r.ok("sandbox pod hardening (as the API server has it): non-root, every capability dropped, no privilege escalation, RuntimeDefault seccomp, read-only root, no service-account token, limits, workspace in memory")
	}
	if pod != nil && pod.Spec.RuntimeClassName != nil {
		r.ok("sandbox pods run under runtime class %s", *pod.Spec.RuntimeClassName)
	}
	checkIdentities(ctx, sb, r, false)
	m.Release("doctor")
}
