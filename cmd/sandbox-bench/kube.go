package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandbox-mcp/sandbox-mcp/session/backend/kube"
)

// kubeBench is the Kubernetes side of a run (-kubeconfig): a namespace of
// its own that enforces Pod Security restricted, deleted at the end.
type kubeBench struct {
	kubeconfig, kubectl, agent, ns string
	cs                             kubernetes.Interface
}

// kubernetes: the rows of the Kubernetes backend, each against `kubectl
// exec` into a running pod of the same spec, in the same run: a new
// session's first sandbox_exec cold and from the warm pool, and a warm
// sandbox_exec.
func (b *bench) kubernetes(ctx context.Context) error {
	if b.kube == nil || b.kube.kubeconfig == "" {
		b.log.Info("bench: kubernetes rows skipped: give -kubeconfig and -agent-image (make k8s-images prints it)")
		return nil
	}
	k := b.kube
	rc, err := clientcmd.BuildConfigFromFlags("", k.kubeconfig)
	if err != nil {
		return err
	}
	if k.cs, err = kubernetes.NewForConfig(rc); err != nil {
		return err
	}
	var rb [4]byte
	rand.Read(rb[:])
	k.ns = "sandbox-bench-" + hex.EncodeToString(rb[:])
	if _, err := k.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: k.ns,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	defer k.cs.CoreV1().Namespaces().Delete(context.Background(), k.ns, metav1.DeleteOptions{})

	// The baseline: a pod of the same spec, and kubectl exec into it.
	p := kube.Pod(kube.Params{Name: "bench-baseline", Namespace: k.ns, Image: b.image, AgentImage: k.agent,
		PullPolicy: corev1.PullIfNotPresent, UID: 1000, GID: 1000, Labels: map[string]string{"io.sandbox-mcp.bench": "1"},
		WorkspaceBytes: 64 << 20, TmpBytes: 64 << 20, Memory: 256 << 20, NanoCPUs: 1_000_000_000})
	if _, err := k.cs.CoreV1().Pods(k.ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, err := k.cs.CoreV1().Pods(k.ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err == nil && got.Status.Phase == corev1.PodRunning {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the baseline pod did not run within 2 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
	kexec := func(n int) ([]float64, error) {
		return timeCmd(n, nil, k.kubectl, "--kubeconfig", k.kubeconfig, "-n", k.ns, "exec", p.Name, "-c", kube.SandboxContainer, "--", "true")
	}
	base, err := kexec(b.n(20))
	if err != nil {
		return err
	}
	b.series("kubectl exec POD true", base)
	baseline := fmt.Sprintf("`kubectl exec POD true`: p50 %s", fmtMs(median(base)))

	args := []string{"--backend", "kubernetes", "--kubeconfig", k.kubeconfig, "--namespace", k.ns, "--agent-image", k.agent}
	first := func(warm bool) ([]float64, error) {
		extra := args
		if warm {
			extra = append(append([]string(nil), args...), "--warm", "1")
		}
		srv, err := b.startServer(extra...)
		if err != nil {
			return nil, err
		}
		defer srv.stop()
		var out []float64
		for range b.n(5) {
			if warm {
				if err := k.waitRunningPods(ctx, 1); err != nil {
					return nil, fmt.Errorf("%w: %s", err, srv.lastLines())
				}
				time.Sleep(300 * time.Millisecond) // its agent answered hello
			}
			start := time.Now()
			cs, err := srv.connect(ctx)
			if err != nil {
				return nil, err
			}
			if err := execTrue(ctx, cs); err != nil {
				cs.Close()
				return nil, err
			}
			out = append(out, ms(time.Since(start)))
			cs.Close()
		}
		return out, nil
	}
	cold, err := first(false)
	if err != nil {
		return err
	}
	b.series("kubernetes: first sandbox_exec, cold", cold)
	b.add(Row{Measure: "kubernetes: first `sandbox_exec` of a new session, cold (a new pod)", Value: fmtMs(median(cold)),
		Baseline: baseline, Ratio: median(cold) / median(base), Goal: "—", Met: true,
		Note: "create, schedule, init container, exec of the agent; the baseline execs into a running pod"})
	warm, err := first(true)
	if err != nil {
		return err
	}
	b.series("kubernetes: first sandbox_exec, warm pool", warm)
	r := median(warm) / median(base)
	b.add(Row{Measure: "kubernetes: first `sandbox_exec` of a new session, warm pool (`--warm 1`)", Value: fmtMs(median(warm)),
		Baseline: baseline, Ratio: r, Goal: "≤ 1.0×", Met: r <= 1.0})

	srv, err := b.startServer(args...)
	if err != nil {
		return err
	}
	defer srv.stop()
	cs, err := srv.connect(ctx)
	if err != nil {
		return err
	}
	defer cs.Close()
	for range 5 {
		if err := execTrue(ctx, cs); err != nil {
			return err
		}
	}
	var ours []float64
	for range b.n(200) {
		start := time.Now()
		if err := execTrue(ctx, cs); err != nil {
			return err
		}
		ours = append(ours, ms(time.Since(start)))
	}
	b.series("kubernetes: sandbox_exec true (warm)", ours)
	r = median(ours) / median(base)
	b.add(Row{Measure: "kubernetes: warm `sandbox_exec` of `true`", Value: fmt.Sprintf("p50 %s, p99 %s", fmtMs(median(ours)), fmtMs(percentile(ours, 99))),
		Baseline: baseline, Ratio: r, Goal: "p50 ≤ 0.05×", Met: r <= 0.05})
	return nil
}

// waitRunningPods waits until n sandbox pods run in the namespace.
func (k *kubeBench) waitRunningPods(ctx context.Context, n int) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		list, err := k.cs.CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelRole + "=sandbox"})
		if err != nil {
			return err
		}
		running := 0
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running++
			}
		}
		if running >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the warm pool did not fill within 2 minutes")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
