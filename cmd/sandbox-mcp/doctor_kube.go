package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/sandbox-mcp/sandbox-mcp/session"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/kube"
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
	m, release, err := newManager(ctx, cfg, quiet, nil, false)
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
	checkKubeTemplates(ctx, cfg, m, r)
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
	if pod != nil {
		checkKubePids(ctx, probe, pod.Name, r) // last: it may end the sandbox
	}
	m.Release("doctor")
}

// checkKubeTemplates checks every template's image the way the cluster
// would run it: nodes are not asked for their images, so a sandbox pod of
// each template with an image of its own starts and runs `true` (once per
// image). A missing image is a FAIL naming the template, the image and
// what to do.
func checkKubeTemplates(ctx context.Context, cfg Config, m *session.Manager, r *report) {
	checked := map[string]bool{cfg.Image: true}
	for _, t := range cfg.Templates {
		if checked[t.Image] {
			continue
		}
		checked[t.Image] = true
		key := "doctor-template-" + t.Name
		sb, err := m.SandboxWithTemplate(key, "", t.Name)
		if err == nil {
			var res session.ExecResult
			res, err = sb.Exec(ctx, session.ExecRequest{Argv: []string{"true"}, Cwd: ".", Timeout: 30 * time.Second})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("`true` exited %d", res.ExitCode)
			}
		}
		m.Release(key)
		var im *backend.ImageMissingError
		switch {
		case errors.As(err, &im):
			r.fail("template %s: image %s is not on the node that ran its pod, nor in a registry the node reaches: load it into every node that runs sandboxes (make k8s-images does on a test node) or push it to a registry they reach, or change the template's \"image\" in %s (the pod: %s)", t.Name, t.Image, cfg.ConfigFile, im.Where)
		case err != nil:
			r.fail("template %s: image %s: a sandbox pod of it could not run `true`: %v", t.Name, t.Image, err)
		default:
			r.ok("template %s: image %s (a sandbox pod of it ran `true`)", t.Name, t.Image)
		}
	}
}

// pidsProbeThreads is how far doctor's probe goes looking for a sandbox
// pod's process limit: a limit above it counts as none.
const pidsProbeThreads = 4096

// kubeletPidsFix says how to give sandbox pods a process limit.
const kubeletPidsFix = "set podPidsLimit in the kubelet configuration of every node that runs sandboxes (podPidsLimit: 1024 in its KubeletConfiguration file, or the flag --pod-max-pids=1024) and restart the kubelets; Kubernetes has no per-pod field for it"

// threadLimitRE is the Go runtime's last words when a thread cannot be made.
var threadLimitRE = regexp.MustCompile(`failed to create new OS thread \(have (\d+) already; errno=(\d+)\)`)

// checkKubePids learns the process limit a real sandbox pod gets: the
// agent's probe creates threads (which pids.max counts like processes)
// until one fails or it has pidsProbeThreads. A failure with EAGAIN is the
// pod's pids.max (the kubelet's podPidsLimit, on the pod's cgroup, which
// the container cannot read); getting there means a fork bomb in a
// sandbox reaches the node: a FAIL.
func checkKubePids(ctx context.Context, probe *kube.Cluster, pod string, r *report) {
	// The probe runs beside the agent, in an exec of its own: at the limit
	// the agent may fail to make a thread and end the sandbox, and the
	// probe's answer must not ride on the agent's stream.
	pctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	stdout, stderr, exit, err := probe.Exec(pctx, pod, []string{kube.AgentPath, "probe-pids", strconv.Itoa(pidsProbeThreads)}, 16<<10)
	if err != nil {
		r.warn("could not learn the process limit of sandbox pods: %v", err)
		return
	}
	verdict, msg := pidsVerdict(stdout, stderr, exit)
	switch verdict {
	case "ok":
		r.ok("%s", msg)
	case "fail":
		r.fail("%s", msg)
	default:
		r.warn("%s", msg)
	}
}

// pidsVerdict reads the probe's output: "ok", "fail" or "warn", and what
// to print. It is pure.
func pidsVerdict(stdout, stderr string, exit int) (verdict, msg string) {
	own := "unknown"
	if line, _, _ := strings.Cut(stdout, "\n"); strings.HasPrefix(line, "cgroup ") {
		own = strings.TrimPrefix(line, "cgroup ")
	}
	if m := threadLimitRE.FindStringSubmatch(stderr); m != nil {
		if m[2] != "11" {
			return "warn", fmt.Sprintf("could not learn the process limit of sandbox pods: creating threads failed at %s with errno %s (not a process limit; the pod's memory?)", m[1], m[2])
		}
		return "ok", fmt.Sprintf("sandbox pods are limited to about %s processes and threads (creating one more failed with EAGAIN; the container's own pids.max: %s, so the limit is the pod's, the kubelet's podPidsLimit)", m[1], own)
	}
	if n, ok := strings.CutPrefix(strings.TrimSpace(stdout[strings.Index(stdout, "\n")+1:]), "reached "); ok && exit == 0 {
		return "fail", fmt.Sprintf("a sandbox pod ran %s threads without reaching a process limit (the container's own pids.max: %s): a fork bomb in a sandbox reaches the node; %s", n, own, kubeletPidsFix)
	}
	return "warn", fmt.Sprintf("could not learn the process limit of sandbox pods: the probe exited %d (%q %q)", exit, truncateOutput(stdout), truncateOutput(stderr))
}

func truncateOutput(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
