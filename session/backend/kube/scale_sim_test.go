package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// The scale simulation (hack/scale-sim.sh, `make scale-sim`) runs this test
// against a private control plane whose nodes are kwok's fakes. It measures
// the backend's control path — create a sandbox pod and watch it until its
// sandbox container runs (what Start does before it execs the agent), refill
// a warm pool, sweep a dead server's pods — at the scale of a large cluster.
// Without SANDBOX_MCP_SCALE_KUBECONFIG it skips: it needs that cluster.
const (
	simEnvKubeconfig = "SANDBOX_MCP_SCALE_KUBECONFIG"
	simEnvNodes      = "SANDBOX_MCP_SCALE_NODES"
	simEnvSandboxes  = "SANDBOX_MCP_SCALE_SANDBOXES"
	simEnvServers    = "SANDBOX_MCP_SCALE_SERVERS"
	simEnvOut        = "SANDBOX_MCP_SCALE_OUT"
	simNamespace     = "sandbox-mcp-scale"
	// simPerServer is how many sandboxes one simulated server starts at
	// once: its --max-sessions, as --warm and new sessions ask for them.
	simPerServer = 32
)

// SimResult is what the simulation reports (docs/scale.md explains it).
type SimResult struct {
	Nodes     int `json:"nodes"`
	Sandboxes int `json:"sandboxes"`
	Servers   int `json:"servers"`
	// ClientQPS and ClientBurst are each simulated server's client-go
	// limits (those of the rest.Config the server would use).
	ClientQPS   float32 `json:"client_qps"`
	ClientBurst int     `json:"client_burst"`

	NodesSeconds float64 `json:"nodes_seconds"` // creating the fake nodes

	StartSeconds     float64 `json:"start_seconds"`       // all sandboxes, created to running
	PodsPerSecond    float64 `json:"pods_per_second"`     // sandboxes / StartSeconds
	StartP50Millis   float64 `json:"start_p50_ms"`        // one sandbox, create to running
	StartP99Millis   float64 `json:"start_p99_ms"`        //
	StartFailures    int     `json:"start_failures"`      // must be 0
	CallsPerSandbox  float64 `json:"calls_per_sandbox"`   // API requests of the start path
	CallsBySandboxes Calls   `json:"calls_by_kind"`       // by verb and resource
	WatchesAtOnce    int     `json:"watches_at_once_max"` // open watches, most at one time

	RefillPool        int     `json:"refill_pool"`         // warm pods taken, then refilled
	RefillSeconds     float64 `json:"refill_seconds"`      // from empty to full again
	SweepPods         int     `json:"sweep_pods"`          // pods of the dead server
	SweepSeconds      float64 `json:"sweep_seconds"`       // Sweep's run
	SweepCalls        Calls   `json:"sweep_calls_by_kind"` // its API requests
	LeftAfterSweep    int     `json:"left_after_sweep"`    // must be 0
	APIServerTotal    float64 `json:"apiserver_requests_total"`
	APIServerPerSbx   float64 `json:"apiserver_requests_per_sandbox"`
	GoMaxProcs        int     `json:"host_cpus"`
	FinishedAtRFC3339 string  `json:"finished_at"`
}

// Calls counts API requests by "VERB resource[/subresource]".
type Calls map[string]int64

// counter is a RoundTripper that counts the requests passing through it,
// and the watches open at once.
type counter struct {
	next     http.RoundTripper
	mu       sync.Mutex
	calls    Calls
	watching atomic.Int64
	maxWatch atomic.Int64
}

func (c *counter) RoundTrip(r *http.Request) (*http.Response, error) {
	kind := r.Method + " " + resourceOf(r.URL.Path)
	watch := r.URL.Query().Get("watch") == "true"
	if watch {
		kind = "WATCH " + resourceOf(r.URL.Path)
	}
	c.mu.Lock()
	c.calls[kind]++
	c.mu.Unlock()
	resp, err := c.next.RoundTrip(r)
	if watch && err == nil {
		n := c.watching.Add(1)
		for {
			m := c.maxWatch.Load()
			if n <= m || c.maxWatch.CompareAndSwap(m, n) {
				break
			}
		}
		resp.Body = &watchBody{ReadCloser: resp.Body, c: c}
	}
	return resp, err
}

type watchBody struct {
	io.ReadCloser
	c    *counter
	once sync.Once
}

func (w *watchBody) Close() error {
	w.once.Do(func() { w.c.watching.Add(-1) })
	return w.ReadCloser.Close()
}

func (c *counter) snapshot() Calls {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := Calls{}
	for k, v := range c.calls {
		out[k] = v
	}
	return out
}

func (c Calls) total() int64 {
	var n int64
	for _, v := range c {
		n += v
	}
	return n
}

func (c Calls) minus(before Calls) Calls {
	out := Calls{}
	for k, v := range c {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// resourceOf turns /api/v1/namespaces/ns/pods/name/exec into pods/exec and
// /apis/coordination.k8s.io/v1/namespaces/ns/leases/x into leases.
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i := 0; i < len(parts); i++ {
		if parts[i] == "namespaces" && i+2 < len(parts) {
			rest := parts[i+2:]
			if len(rest) >= 3 {
				return rest[0] + "/" + rest[2]
			}
			return rest[0]
		}
	}
	if len(parts) > 0 {
		return parts[len(parts)-1]
	}
	return path
}

func simInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// simStart is the control path of Cluster.Start up to the agent: the pod
// made by Pod with the names and labels Start gives it, created, then
// watched by waitRunning until its sandbox container runs. (On kwok's
// nodes nothing runs, so there is no agent to exec.)
func simStart(ctx context.Context, c *Cluster, sandbox string) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StartTimeout)
	defer cancel()
	p := c.cfg.complete(Params{
		Name:           "sbx-" + sandbox,
		Image:          "sandbox-mcp:sim",
		PullPolicy:     corev1.PullNever,
		UID:            1000,
		GID:            1000,
		WorkspaceBytes: 512 << 20,
		TmpBytes:       64 << 20,
		Memory:         1 << 30,
		NanoCPUs:       1e9,
	}, sandbox, ownerAnnotation(), time.Now())
	created, err := c.cs.CoreV1().Pods(c.cfg.Namespace).Create(ctx, Pod(p), metav1.CreateOptions{})
	if err != nil {
		return startError(p.Name, err)
	}
	return c.waitRunning(ctx, created)
}

func TestScaleSim(t *testing.T) {
	kubeconfig := os.Getenv(simEnvKubeconfig)
	if kubeconfig == "" {
		t.Skip("the scale simulation needs its kwok cluster: run `make scale-sim` (hack/scale-sim.sh)")
	}
	nodes := simInt(t, simEnvNodes, 1000)
	sandboxes := simInt(t, simEnvSandboxes, 10000)
	servers := simInt(t, simEnvServers, max(2, sandboxes/1000))
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	admin, err := kubernetes.NewForConfig(withLimits(rc, 500, 1000))
	if err != nil {
		t.Fatal(err)
	}
	res := SimResult{Nodes: nodes, Sandboxes: sandboxes, Servers: servers, GoMaxProcs: runtime.NumCPU()}

	// The fake nodes: a large cloud instance each (64 CPUs, 256 GiB,
	// 250 pods), so that the pods' requests are not what limits them.
	t0 := time.Now()
	parallel(nodes, 50, func(i int) error {
		_, err := admin.CoreV1().Nodes().Create(ctx, fakeNode(i), metav1.CreateOptions{})
		return err
	}, t)
	res.NodesSeconds = time.Since(t0).Seconds()
	waitNodesReady(t, admin, nodes)
	t.Logf("%d fake nodes ready in %.1fs", nodes, time.Since(t0).Seconds())

	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: simNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The namespace's default service account, which a controller manager
	// would make (this control plane runs none): admission wants it even
	// though sandbox pods mount no token.
	if _, err := admin.CoreV1().ServiceAccounts(simNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	apiBefore := apiserverRequests(t, admin)

	// The servers: each a Cluster with its own client, as separate
	// processes have, and the rest.Config limits a server gets.
	counters := make([]*counter, servers)
	clusters := make([]*Cluster, servers)
	for i := range servers {
		crc := rest.CopyConfig(rc)
		cnt := &counter{calls: Calls{}}
		crc.Wrap(func(rt http.RoundTripper) http.RoundTripper { cnt.next = rt; return cnt })
		c, err := NewCluster(crc, Config{Namespace: simNamespace, Instance: fmt.Sprintf("sim-%d", i), AgentImage: "sandbox-mcp-agent:sim", StartTimeout: 10 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		counters[i], clusters[i] = cnt, c
		if i == 0 {
			res.ClientQPS, res.ClientBurst = c.rest.QPS, c.rest.Burst
			continue // server 0 is the one that dies: its lease is made expired below
		}
		// The others hold a live lease, renewed while the test runs, as
		// running servers do: the sweep must leave their pods alone.
		if err := c.Prepare(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
	}

	// Start every sandbox: each server starts its share, simPerServer at
	// a time.
	var mu sync.Mutex
	var lat []time.Duration
	var failures atomic.Int64
	var firstErr atomic.Value
	t0 = time.Now()
	var wg sync.WaitGroup
	for s := range servers {
		share := sandboxes / servers
		if s < sandboxes%servers {
			share++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem := make(chan struct{}, simPerServer)
			var swg sync.WaitGroup
			for j := range share {
				sem <- struct{}{}
				swg.Add(1)
				go func() {
					defer func() { <-sem; swg.Done() }()
					st := time.Now()
					if err := simStart(ctx, clusters[s], fmt.Sprintf("s%d-%d", s, j)); err != nil {
						failures.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
						return
					}
					d := time.Since(st)
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				}()
			}
			swg.Wait()
		}()
	}
	progressDone := make(chan struct{})
	go func() {
		tk := time.NewTicker(15 * time.Second)
		defer tk.Stop()
		for {
			select {
			case <-progressDone:
				return
			case <-tk.C:
				mu.Lock()
				n := len(lat)
				mu.Unlock()
				t.Logf("%d of %d sandboxes running after %.0fs", n, sandboxes, time.Since(t0).Seconds())
			}
		}
	}()
	wg.Wait()
	close(progressDone)
	res.StartSeconds = time.Since(t0).Seconds()
	res.StartFailures = int(failures.Load())
	if res.StartFailures > 0 {
		t.Errorf("%d sandboxes did not start; the first: %v", res.StartFailures, firstErr.Load())
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		res.PodsPerSecond = float64(len(lat)) / res.StartSeconds
		res.StartP50Millis = float64(lat[len(lat)/2].Milliseconds())
		res.StartP99Millis = float64(lat[len(lat)*99/100].Milliseconds())
	}
	startCalls := Calls{}
	for _, c := range counters {
		for k, v := range c.snapshot() {
			startCalls[k] += v
		}
		res.WatchesAtOnce += int(c.maxWatch.Load())
	}
	res.CallsBySandboxes = startCalls
	res.CallsPerSandbox = float64(startCalls.total()) / float64(sandboxes)
	t.Logf("%d sandboxes running in %.1fs: %.1f pods/s, p50 %.0f ms, p99 %.0f ms, %.2f API calls each %v",
		len(lat), res.StartSeconds, res.PodsPerSecond, res.StartP50Millis, res.StartP99Millis, res.CallsPerSandbox, startCalls)

	// Warm pool refill: one server's pool of simPerServer pods is taken
	// at once by arriving sessions; the time until it is full again.
	refill := clusters[0]
	t0 = time.Now()
	parallel(simPerServer, simPerServer, func(i int) error {
		return simStart(ctx, refill, fmt.Sprintf("warm-%d", i))
	}, t)
	res.RefillPool, res.RefillSeconds = simPerServer, time.Since(t0).Seconds()
	t.Logf("warm pool of %d refilled in %.2fs", simPerServer, res.RefillSeconds)

	// Sweep: server 0 dies (kill -9: its Lease is left to expire); server
	// 1 (or a new one) sweeps its pods.
	dead := clusters[0].cfg.Instance
	expired := metav1.NewMicroTime(time.Now().Add(-time.Hour))
	secs := int32(DefaultLeaseDuration / time.Second)
	holder := "sim"
	if _, err := admin.CoordinationV1().Leases(simNamespace).Create(ctx, &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: LeaseName(dead), Labels: map[string]string{LabelManaged: "1", LabelInstance: dead}},
		Spec:       coordv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, RenewTime: &expired},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadPods := countPods(t, admin, LabelInstance+"="+dead)
	sweeperIdx := min(1, servers-1)
	if sweeperIdx == 0 {
		t.Fatal("the sweep needs two servers: set " + simEnvServers + " to 2 or more")
	}
	sweeper := clusters[sweeperIdx]
	before := counters[sweeperIdx].snapshot()
	t0 = time.Now()
	n, err := sweeper.Sweep(ctx)
	res.SweepSeconds = time.Since(t0).Seconds()
	if err != nil {
		t.Errorf("sweep: %v", err)
	}
	res.SweepPods = n
	res.SweepCalls = counters[sweeperIdx].snapshot().minus(before)
	res.LeftAfterSweep = countPods(t, admin, LabelInstance+"="+dead)
	if n != deadPods || res.LeftAfterSweep != 0 {
		t.Errorf("sweep deleted %d pods of %d of the dead server; %d left", n, deadPods, res.LeftAfterSweep)
	}
	if left, want := countPods(t, admin, LabelManaged+"=1"), sandboxes+simPerServer-deadPods; left != want {
		t.Errorf("%d pods of live servers left after the sweep, want all %d", left, want)
	}
	t.Logf("sweep of %d pods: %.1fs, calls %v", n, res.SweepSeconds, res.SweepCalls)

	if after := apiserverRequests(t, admin); after > 0 && apiBefore >= 0 {
		res.APIServerTotal = after - apiBefore
		res.APIServerPerSbx = res.APIServerTotal / float64(sandboxes)
	}
	res.FinishedAtRFC3339 = time.Now().UTC().Format(time.RFC3339)
	if out := os.Getenv(simEnvOut); out != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
			t.Error(err)
		}
	}
}

func withLimits(rc *rest.Config, qps float32, burst int) *rest.Config {
	rc = rest.CopyConfig(rc)
	rc.QPS, rc.Burst = qps, burst
	return rc
}

func fakeNode(i int) *corev1.Node {
	name := fmt.Sprintf("kwok-node-%04d", i)
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("64"),
		corev1.ResourceMemory:           resource.MustParse("256Gi"),
		corev1.ResourcePods:             resource.MustParse("250"),
		corev1.ResourceEphemeralStorage: resource.MustParse("1Ti"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
			Labels:      map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "type": "kwok"},
		},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
}

func waitNodesReady(t *testing.T, cs kubernetes.Interface, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		list, err := cs.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{LabelSelector: "type=kwok"})
		if err != nil {
			t.Fatal(err)
		}
		ready := 0
		for _, n := range list.Items {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		if ready >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d fake nodes ready after 10 minutes: is kwok running?", ready, want)
		}
		time.Sleep(2 * time.Second)
	}
}

func countPods(t *testing.T, cs kubernetes.Interface, selector string) int {
	t.Helper()
	list, err := cs.CoreV1().Pods(simNamespace).List(t.Context(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	return len(list.Items)
}

// apiserverRequests is the API server's own count of the requests it
// served (apiserver_request_total summed), or -1 if it cannot be read.
func apiserverRequests(t *testing.T, cs kubernetes.Interface) float64 {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(t.Context())
	if err != nil {
		t.Logf("apiserver metrics: %v", err)
		return -1
	}
	var sum float64
	for line := range strings.SplitSeq(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// parallel runs fn(0..n-1), at most width at once, and fails the test on
// the first error.
func parallel(n, width int, fn func(i int) error, t *testing.T) {
	t.Helper()
	sem := make(chan struct{}, width)
	var wg sync.WaitGroup
	var first atomic.Value
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(i); err != nil {
				first.CompareAndSwap(nil, err.Error())
			}
		}()
	}
	wg.Wait()
	if e := first.Load(); e != nil {
		t.Fatal(e)
	}
}
