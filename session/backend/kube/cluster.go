package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// Defaults of Config.
const (
	// DefaultLeaseDuration is how long a server's Lease is valid without
	// renewal; the server renews it every third of that. Another server
	// sweeps the pods of a server whose lease ran out.
	DefaultLeaseDuration = 30 * time.Second
	// DefaultQPS and DefaultBurst are the client's request rate limits
	// when the rest.Config sets none. client-go's own (5 and 10) cap one
	// server at about two sandbox starts a second and a sweep at five
	// pods a second (docs/scale.md); these are kubectl's order of size.
	DefaultQPS   = 50
	DefaultBurst = 100
	// DefaultStartTimeout bounds a pod's start: scheduling, both images,
	// the init container and the agent's exec.
	DefaultStartTimeout = 60 * time.Second
)

// Config configures a Cluster.
type Config struct {
	// Namespace holds every object the backend makes. Required.
	Namespace string
	// Instance names this server: the Lease it renews and the label on its
	// pods. Required; a DNS label.
	Instance string
	// AgentImage is the image the init container copies the agent from.
	AgentImage string
	// PullPolicy for the sandbox and agent images; "" means IfNotPresent.
	PullPolicy corev1.PullPolicy
	// RuntimeClass is every pod's runtimeClassName ("" for the default).
	RuntimeClass string
	// SeccompLocalhost is the seccomp profile of every sandbox container, a
	// path under the kubelet's seccomp directory on each node ("" for the
	// runtime's default profile).
	SeccompLocalhost string
	// LeaseDuration; 0 means DefaultLeaseDuration.
	LeaseDuration time.Duration
	// StartTimeout; 0 means DefaultStartTimeout.
	StartTimeout time.Duration
	// Proxy is where pods reach this server's egress proxy; nil when the
	// server has none (every sandbox without network).
	Proxy *Proxy
	// Logger; nil discards.
	Logger *slog.Logger
}

// Cluster runs sandbox pods in one namespace of one cluster. It is safe for
// concurrent use.
type Cluster struct {
	cs   kubernetes.Interface
	rest *rest.Config
	cfg  Config
	log  *slog.Logger

	leaseOnce sync.Once
	leaseStop context.CancelFunc
	leaseDone chan struct{}

	// The pod watch: one informer for this server's pods, which ends the
	// exec stream of a pod deleted or ended from outside (a deleted pod's
	// exec stream is not always closed by the kubelet).
	watchOnce sync.Once
	watchStop chan struct{}
	liveMu    sync.Mutex
	live      map[string]context.CancelCauseFunc // pod name -> ends its stream
}

// RESTConfig loads the cluster's client configuration: from kubeconfig if
// set, else in-cluster (the pod's service account), else $KUBECONFIG.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if rc, err := rest.InClusterConfig(); err == nil {
		return rc, nil
	}
	if env := os.Getenv("KUBECONFIG"); env != "" {
		return clientcmd.BuildConfigFromFlags("", env)
	}
	return nil, errors.New("no cluster configuration: set --kubeconfig, or run in a pod with a service account")
}

// NewCluster returns a Cluster on rc.
func NewCluster(rc *rest.Config, cfg Config) (*Cluster, error) {
	if cfg.Namespace == "" || cfg.Instance == "" {
		return nil, errors.New("kube: a namespace and an instance name are required")
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rc = rest.CopyConfig(rc)
	if rc.UserAgent == "" {
		rc.UserAgent = "sandbox-mcp"
	}
	if rc.QPS == 0 && rc.RateLimiter == nil {
		rc.QPS, rc.Burst = DefaultQPS, DefaultBurst
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube: %w", err)
	}
	return &Cluster{cs: cs, rest: rc, cfg: cfg, log: log}, nil
}

// Clientset is the cluster's client, for tests and tools beside the server.
func (c *Cluster) Clientset() kubernetes.Interface { return c.cs }

// Namespace is the namespace the cluster works in.
func (c *Cluster) Namespace() string { return c.cfg.Namespace }

// LeaseName is the name of the Lease a server instance renews.
func LeaseName(instance string) string { return "sandbox-mcp-" + instance }

// Prepare checks that the namespace is reachable, writes this server's
// Lease and starts renewing it until Close.
func (c *Cluster) Prepare(ctx context.Context) error {
	if _, err := c.cs.CoreV1().Pods(c.cfg.Namespace).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return apiError("list pods in namespace "+c.cfg.Namespace, err)
	}
	if err := c.renewLease(ctx); err != nil {
		return err
	}
	if err := c.preparePolicies(ctx); err != nil {
		return err
	}
	c.leaseOnce.Do(func() {
		lctx, cancel := context.WithCancel(context.Background())
		c.leaseStop, c.leaseDone = cancel, make(chan struct{})
		go c.keepLease(lctx)
	})
	return nil
}

// keepLease renews the lease every third of its duration until ctx ends.
func (c *Cluster) keepLease(ctx context.Context) {
	defer close(c.leaseDone)
	t := time.NewTicker(c.cfg.LeaseDuration / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, c.cfg.LeaseDuration/3)
			if err := c.renewLease(rctx); err != nil && ctx.Err() == nil {
				c.log.Warn("kube: renew lease", "err", err)
			}
			cancel()
		}
	}
}

// renewLease creates or renews this server's Lease.
func (c *Cluster) renewLease(ctx context.Context) error {
	leases := c.cs.CoordinationV1().Leases(c.cfg.Namespace)
	now := metav1.NewMicroTime(time.Now())
	secs := int32(c.cfg.LeaseDuration / time.Second)
	holder := c.cfg.Instance
	name := LeaseName(c.cfg.Instance)
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelManaged: "1", LabelInstance: c.cfg.Instance}},
			Spec:       coordv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
		}
		_, err = leases.Create(ctx, l, metav1.CreateOptions{})
		return apiError("create lease "+name, err)
	}
	if err != nil {
		return apiError("read lease "+name, err)
	}
	l.Spec.RenewTime, l.Spec.LeaseDurationSeconds, l.Spec.HolderIdentity = &now, &secs, &holder
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return apiError("renew lease "+name, err)
}

// Close stops renewing the lease and deletes it (call it after removing
// this server's pods: a deleted lease lets others sweep at once).
func (c *Cluster) Close(ctx context.Context) error {
	c.liveMu.Lock()
	if c.watchStop != nil {
		close(c.watchStop)
		c.watchStop = nil
	}
	c.liveMu.Unlock()
	if c.leaseStop != nil {
		c.leaseStop()
		<-c.leaseDone
	}
	perr := c.deleteProxyPolicy(ctx, c.cfg.Instance)
	err := c.cs.CoordinationV1().Leases(c.cfg.Namespace).Delete(ctx, LeaseName(c.cfg.Instance), metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return perr
	}
	return errors.Join(perr, apiError("delete lease", err))
}

// leaseExpired reports whether a lease is past its renew time plus its
// duration (a lease that lacks either counts as expired).
func leaseExpired(l *coordv1.Lease, now time.Time) bool {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return true
	}
	return now.After(l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second))
}

// Sweep deletes the sandbox pods that no live server holds: pods that ended
// (a sandbox pod is never restarted), and pods of a server whose Lease is
// gone or expired, and such expired Leases. It never deletes a running pod
// of a server whose lease is live. It returns how many pods it deleted.
func (c *Cluster) Sweep(ctx context.Context) (int, error) {
	pods, err := c.cs.CoreV1().Pods(c.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelManaged + "=1," + LabelRole + "=sandbox"})
	if err != nil {
		return 0, apiError("list sandbox pods", err)
	}
	leases := c.cs.CoordinationV1().Leases(c.cfg.Namespace)
	live := map[string]bool{c.cfg.Instance: true}
	known := map[string]bool{}
	now := time.Now()
	n := 0
	dead := map[string]int{} // instance -> its pods, deleted together below
	for i := range pods.Items {
		p := &pods.Items[i]
		inst := p.Labels[LabelInstance]
		ended := p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
		if !known[inst] {
			known[inst] = true
			l, err := leases.Get(ctx, LeaseName(inst), metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return n, apiError("read lease of "+inst, err)
			default:
				live[inst] = live[inst] || !leaseExpired(l, now)
			}
		}
		if !live[inst] {
			dead[inst]++
			continue
		}
		if !ended {
			continue
		}
		if err := c.deletePod(ctx, p.Name); err != nil {
			c.log.Warn("kube: sweep: delete pod", "pod", p.Name, "err", err)
			continue
		}
		n++
		c.log.Info("kube: swept ended pod", "pod", p.Name, "phase", p.Status.Phase, "sandbox", p.Labels[LabelSandbox], "instance", inst)
	}
	// A dead server's pods go in one request per server (a delete
	// collection by its label), not one per pod: a sweep of thousands of
	// pods costs the API server one call and the server no rate limit.
	zero := int64(0)
	for inst, count := range dead {
		err := c.cs.CoreV1().Pods(c.cfg.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero},
			metav1.ListOptions{LabelSelector: LabelManaged + "=1," + LabelRole + "=sandbox," + LabelInstance + "=" + inst})
		if err != nil {
			c.log.Warn("kube: sweep: delete the pods of a server that is gone", "instance", inst, "err", err)
			continue
		}
		n += count
		c.log.Info("kube: swept orphaned pods of a server that is gone", "instance", inst, "pods", count)
	}
	// Expired leases of servers that are gone, their pods swept above.
	ls, err := leases.List(ctx, metav1.ListOptions{LabelSelector: LabelManaged + "=1"})
	if err != nil {
		return n, apiError("list leases", err)
	}
	for i := range ls.Items {
		l := &ls.Items[i]
		if inst := l.Labels[LabelInstance]; inst != c.cfg.Instance && leaseExpired(l, now) {
			if err := c.deleteProxyPolicy(ctx, inst); err != nil {
				c.log.Warn("kube: sweep: delete network policy", "instance", inst, "err", err)
			}
			if err := leases.Delete(ctx, l.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				c.log.Warn("kube: sweep: delete lease", "lease", l.Name, "err", err)
			}
		}
	}
	return n, nil
}

// deletePod deletes a pod at once (no grace: the sandbox has nothing to
// save once the server let go of it).
func (c *Cluster) deletePod(ctx context.Context, name string) error {
	zero := int64(0)
	err := c.cs.CoreV1().Pods(c.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// ownerAnnotation describes this server process, like the Docker
// backend's owner labels.
func ownerAnnotation() string {
	host, _ := os.Hostname()
	return host + "/" + strconv.Itoa(os.Getpid())
}

// Start creates a sandbox pod from p (completed by Config.complete), waits until its sandbox container runs, and execs the agent.
// The returned Instance's Stdout and Stdin are the agent's protocol stream. A
// pod that cannot start is deleted and reported as UNAVAILABLE with the
// reason the cluster gave; the wait is bounded by Config.StartTimeout.
func (c *Cluster) Start(ctx context.Context, sandbox string, p Params) (*Instance, error) {
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StartTimeout)
	defer cancel()
	p = c.cfg.complete(p, sandbox, ownerAnnotation(), time.Now())

	if caller.Err() != nil {
		return nil, context.Cause(caller) // abandoned before anything was made
	}
	// The pod is the start's from the moment its create request is sent:
	// whatever happens next, a start that does not return it deletes it
	// by name. The create's answer is awaited even when ctx ends meanwhile
	// (bounded by createWait): an API server may carry out a create whose
	// client gave up, and a delete sent before that would find nothing.
	ok := false
	defer func() {
		if !ok {
			dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer dcancel()
			if err := c.deletePod(dctx, p.Name); err != nil {
				c.log.Warn("kube: delete pod that did not start", "pod", p.Name, "err", err)
			}
		}
	}()
	pods := c.cs.CoreV1().Pods(c.cfg.Namespace)
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), createWait)
	created, err := pods.Create(cctx, Pod(p), metav1.CreateOptions{})
	ccancel()
	if caller.Err() != nil {
		return nil, context.Cause(caller)
	}
	if err != nil {
		return nil, startError(p.Name, err)
	}
	if err := c.waitRunning(ctx, created); err != nil {
		if caller.Err() != nil {
			return nil, context.Cause(caller)
		}
		return nil, err
	}
	pod, err := c.execAgent(ctx, p.Name)
	if err != nil {
		return nil, err
	}
	if caller.Err() != nil {
		// Abandoned while the agent's stream opened: end it with the pod.
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer dcancel()
		pod.Remove(dctx)
		return nil, context.Cause(caller)
	}
	ok = true
	return pod, nil
}

// createWait bounds the wait for a pod create's answer after the start
// that sent it was abandoned.
const createWait = 30 * time.Second

// waitRunning watches a pod until its sandbox container runs, or returns
// UNAVAILABLE with the reason it cannot.
func (c *Cluster) waitRunning(ctx context.Context, pod *corev1.Pod) error {
	pods := c.cs.CoreV1().Pods(c.cfg.Namespace)
	last := pod
	for {
		if done, err := podStarted(last); done || err != nil {
			return err
		}
		w, err := pods.Watch(ctx, metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("metadata.name", pod.Name).String(),
			ResourceVersion: last.ResourceVersion,
		})
		if err != nil {
			if ctx.Err() != nil {
				return startTimeout(last, c.cfg.StartTimeout)
			}
			return apiError("watch pod "+pod.Name, err)
		}
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Deleted:
				w.Stop()
				return errcode.Errorf(errcode.Unavailable, "sandbox pod %s was deleted while it started; retry", pod.Name)
			case watch.Error:
				continue
			}
			if p, ok := ev.Object.(*corev1.Pod); ok {
				last = p
				if done, err := podStarted(p); done || err != nil {
					w.Stop()
					return err
				}
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return startTimeout(last, c.cfg.StartTimeout)
		}
		// The watch ended early (the API server closes watches): fetch and
		// watch again from the pod as it is now.
		if p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{}); err == nil {
			last = p
		} else if ctx.Err() != nil {
			return startTimeout(last, c.cfg.StartTimeout)
		}
	}
}

// Waiting reasons that will not resolve by waiting.
var fatalWaiting = map[string]bool{
	"ErrImagePull": true, "ImagePullBackOff": true, "ErrImageNeverPull": true, "InvalidImageName": true,
	"CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true,
	"CrashLoopBackOff": true, "PreCreateHookError": true, "PreStartHookError": true,
}

// imageMissing are the waiting reasons of an image the node does not have
// and cannot pull.
var imageMissing = map[string]bool{"ErrImagePull": true, "ImagePullBackOff": true, "ErrImageNeverPull": true}

// podStarted reports whether the pod's sandbox container runs (true, nil),
// or a reason the pod will not start (an UNAVAILABLE error), or neither
// yet (false, nil). It is pure.
func podStarted(p *corev1.Pod) (bool, error) {
	fail := func(format string, a ...any) (bool, error) {
		return false, errcode.Errorf(errcode.Unavailable, "sandbox pod %s cannot start: "+format, append([]any{p.Name}, a...)...)
	}
	switch p.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		return fail("it ended (%s: %s %s)", p.Status.Phase, p.Status.Reason, p.Status.Message)
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
			return fail("no node can take it (%s); free capacity, lower the sandbox limits, or add nodes", cond.Message)
		}
	}
	check := func(kind string, sts []corev1.ContainerStatus) (bool, error) {
		for _, st := range sts {
			if w := st.State.Waiting; w != nil && fatalWaiting[w.Reason] {
				if kind == "sandbox" && imageMissing[w.Reason] {
					// The sandbox image (a template's, or the server's):
					// the session names the template.
					img := ""
					for _, c := range p.Spec.Containers {
						if c.Name == st.Name {
							img = c.Image
						}
					}
					return false, errcode.Errorf(errcode.Unavailable, "sandbox pod %s cannot start: %w", p.Name, &backend.ImageMissingError{Image: img,
						Where: fmt.Sprintf("on the node, nor in a registry it reaches (%s: %s); load it into the nodes (make k8s-images loads a test node) or push it to their registry", w.Reason, w.Message)})
				}
				hint := ""
				if strings.Contains(w.Reason, "Image") {
					hint = "; check that the image exists on the nodes or in a registry they reach (make k8s-images loads them into a test node)"
				}
				return fail("%s container %s: %s: %s%s", kind, st.Name, w.Reason, w.Message, hint)
			}
			if t := st.State.Terminated; t != nil && (kind == "sandbox" || t.ExitCode != 0) {
				return fail("%s container %s ended: %s (exit %d) %s", kind, st.Name, t.Reason, t.ExitCode, strings.TrimSpace(t.Message))
			}
		}
		return false, nil
	}
	if done, err := check("init", p.Status.InitContainerStatuses); done || err != nil {
		return done, err
	}
	if done, err := check("sandbox", p.Status.ContainerStatuses); done || err != nil {
		return done, err
	}
	for _, st := range p.Status.ContainerStatuses {
		if st.Name == SandboxContainer && st.State.Running != nil {
			return true, nil
		}
	}
	return false, nil
}

// startTimeout is the error of a pod that did not start in time, with the
// last thing the cluster said about it.
func startTimeout(p *corev1.Pod, d time.Duration) error {
	return errcode.Errorf(errcode.Unavailable, "sandbox pod %s did not start within %v (phase %s%s); the cluster may be short of capacity or pulling a large image: retry later",
		p.Name, d, p.Status.Phase, podStatusNote(p))
}

// podStatusNote is the pod's latest condition or container reason, for
// error messages.
func podStatusNote(p *corev1.Pod) string {
	var notes []string
	for _, cond := range p.Status.Conditions {
		if cond.Status == corev1.ConditionFalse && cond.Message != "" {
			notes = append(notes, fmt.Sprintf("%s: %s", cond.Type, cond.Message))
		}
	}
	for _, st := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if w := st.State.Waiting; w != nil && w.Reason != "" {
			notes = append(notes, fmt.Sprintf("%s: %s", st.Name, w.Reason))
		}
	}
	if len(notes) == 0 {
		return ""
	}
	return "; " + strings.Join(notes, "; ")
}

// startError maps a pod create error to UNAVAILABLE with the reason (a
// quota, Pod Security admission, a missing namespace).
func startError(name string, err error) error {
	switch {
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"):
		return errcode.Errorf(errcode.Unavailable, "cannot create sandbox pod %s: the namespace's resource quota is used up (%w); end other sessions or raise the quota", name, err)
	case apierrors.IsForbidden(err):
		return errcode.Errorf(errcode.Unavailable, "cannot create sandbox pod %s: refused by the cluster (%w); the server's service account needs create on pods in its namespace, and the pod must pass the namespace's admission", name, err)
	}
	return apiError("create sandbox pod "+name, err)
}

// apiError reports an API failure as UNAVAILABLE (nil stays nil).
func apiError(what string, err error) error {
	if err == nil {
		return nil
	}
	return errcode.Errorf(errcode.Unavailable, "cannot %s: %w; retrying may help if this was a passing cluster fault", what, err)
}

// execAgent starts the agent in the pod's sandbox container over
// pods/exec (WebSocket, falling back to SPDY) and returns the Instance with the
// stream's ends.
func (c *Cluster) execAgent(ctx context.Context, name string) (*Instance, error) {
	req := c.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(c.cfg.Namespace).Name(name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: SandboxContainer,
			Command:   AttachCommand(),
			Stdin:     true, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(c.rest, "GET", req.URL().String())
	if err != nil {
		return nil, apiError("exec the agent", err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(c.rest, "POST", req.URL())
	if err != nil {
		return nil, apiError("exec the agent", err)
	}
	exec, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return nil, apiError("exec the agent", err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	p := &Instance{
		name: name, c: c,
		stdin: inW, stdout: outR, stdinR: inR,
		stderr: &tailWriter{},
		done:   make(chan struct{}),
	}
	// The stream outlives Start's context: it lives until Remove, or until
	// the pod watch sees the pod go.
	sctx, scancel := context.WithCancelCause(context.WithoutCancel(ctx))
	p.cancel = func() { scancel(nil) }
	c.track(name, scancel)
	go func() {
		err := exec.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: p.stderr})
		var ee interface{ ExitStatus() int }
		if errors.As(err, &ee) && ee.ExitStatus() == ExitSuperseded || errors.Is(context.Cause(sctx), backend.ErrSuperseded) {
			err = backend.ErrSuperseded
		}
		if err == nil {
			err = io.EOF
		}
		p.streamErr = err
		c.untrack(name)
		outW.CloseWithError(err)
		inR.CloseWithError(err)
		close(p.done)
	}()
	return p, nil
}

// Exec runs argv in a sandbox pod's sandbox container over pods/exec, apart
// from the agent's stream, and returns the first maxOutput bytes of its
// stdout and stderr and its exit code. doctor uses it for a probe that may
// take the pod's last process (which the agent may then need).
func (c *Cluster) Exec(ctx context.Context, pod string, argv []string, maxOutput int) (stdout, stderr string, exit int, err error) {
	req := c.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(c.cfg.Namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: SandboxContainer, Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(c.rest, "GET", req.URL().String())
	if err != nil {
		return "", "", 0, apiError("exec in pod "+pod, err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(c.rest, "POST", req.URL())
	if err != nil {
		return "", "", 0, apiError("exec in pod "+pod, err)
	}
	exec, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return "", "", 0, apiError("exec in pod "+pod, err)
	}
	out, errOut := &capWriter{max: maxOutput}, &capWriter{max: maxOutput}
	err = exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: out, Stderr: errOut})
	var ee interface{ ExitStatus() int }
	if errors.As(err, &ee) {
		return out.String(), errOut.String(), ee.ExitStatus(), nil
	}
	if err != nil {
		return out.String(), errOut.String(), 0, apiError("exec in pod "+pod, err)
	}
	return out.String(), errOut.String(), 0, nil
}

// capWriter keeps the first max bytes written to it and drops the rest.
type capWriter struct {
	max int
	b   []byte
}

func (w *capWriter) Write(p []byte) (int, error) {
	if room := w.max - len(w.b); room > 0 {
		w.b = append(w.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (w *capWriter) String() string { return string(w.b) }

// Reattach takes over the agent of a running sandbox pod that another
// server (or this one, earlier) started: the pod is labelled as this
// server's first (an update that fails if the pod changed meanwhile, so
// two servers taking it at once do not both win the label), then a new
// attach takes the agent's stream from the last one. A pod that is gone,
// ended or being deleted is backend.ErrGone.
func (c *Cluster) Reattach(ctx context.Context, name string) (*Instance, error) {
	pods := c.cs.CoreV1().Pods(c.cfg.Namespace)
	for try := 0; ; try++ {
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, backend.ErrGone
		}
		if err != nil {
			return nil, apiError("read sandbox pod "+name, err)
		}
		if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning || pod.Labels[LabelRole] != "sandbox" {
			return nil, backend.ErrGone
		}
		if pod.Labels[LabelInstance] == c.cfg.Instance {
			break
		}
		pod.Labels[LabelInstance] = c.cfg.Instance
		_, err = pods.Update(ctx, pod, metav1.UpdateOptions{})
		if err == nil {
			break
		}
		if !apierrors.IsConflict(err) || try >= 3 {
			return nil, apiError("label sandbox pod "+name+" as this server's", err)
		}
	}
	return c.execAgent(ctx, name)
}

// Find returns the name and generation of a sandbox's running pod,
// whichever server started it; ok is false when it has none (no pod, or
// only ended or deleted ones).
func (c *Cluster) Find(ctx context.Context, sandbox string) (name string, gen int, ok bool, err error) {
	pods, err := c.cs.CoreV1().Pods(c.cfg.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: LabelManaged + "=1," + LabelRole + "=sandbox," + LabelSandbox + "=" + sandbox})
	if err != nil {
		return "", 0, false, apiError("list the pods of sandbox "+sandbox, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		g, _ := strconv.Atoi(p.Name[strings.LastIndexByte(p.Name, '-')+1:])
		if !ok || g > gen {
			name, gen, ok = p.Name, g, true
		}
	}
	return name, gen, ok, nil
}

// release deletes the pod if this server still holds it (its instance
// label is this server's): a pod another server took over is left to
// that server. The delete is conditioned on the pod as read, so a takeover
// between the read and the delete wins.
func (c *Cluster) release(ctx context.Context, name string) error {
	pods := c.cs.CoreV1().Pods(c.cfg.Namespace)
	for try := 0; ; try++ {
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if pod.Labels[LabelInstance] != c.cfg.Instance {
			c.log.Info("kube: sandbox pod held by another server; left to it", "pod", name, "holder", pod.Labels[LabelInstance])
			return nil
		}
		zero := int64(0)
		rv := pod.ResourceVersion
		err = pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero,
			Preconditions: &metav1.Preconditions{UID: &pod.UID, ResourceVersion: &rv}})
		if err == nil || apierrors.IsNotFound(err) {
			return nil
		}
		if !apierrors.IsConflict(err) || try >= 3 {
			return err
		}
	}
}
