package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/kube"
)

// TestKubeForkBombBounded (issue 18 item 8): on the test node, whose
// kubelet sets podPidsLimit 1024, doctor learns that limit from a real
// sandbox pod and passes; a fork bomb in a sandbox pod is stopped by the
// pod's pids cgroup (seen from the node: pids.max 1024, forks refused),
// and the node still starts and serves other sandboxes.
func TestKubeForkBombBounded(t *testing.T) {
	k := newKubeEnv(t)
	cmd := exec.Command(bins.Get(t).Server, append([]string{"doctor", "--image", testenv.TestImage(t), "--state-dir", t.TempDir()}, k.args()...)...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok    sandbox pods are limited to about") || strings.Contains(string(out), "FAIL") {
		t.Fatalf("doctor: %v\n%s", err, out)
	}
	t.Logf("doctor: %s", grepLine(string(out), "processes"))

	s := startServer(t, serverOpts{args: k.args("--memory", "512MiB")})
	id := s.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})["sandbox"].(string)
	pods, err := k.cs.CoreV1().Pods(k.ns).List(context.Background(), metav1.ListOptions{LabelSelector: kube.LabelSandbox + "=" + id})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the sandbox's pod: %v %v", pods, err)
	}
	// The pod's pids cgroup on the node (cgroup v1, the kubelet's cgroupfs
	// driver): kubepods/<qos>/pod<uid>.
	dirs, _ := filepath.Glob("/sys/fs/cgroup/pids/kubepods*/*/pod" + string(pods.Items[0].UID))
	if len(dirs) == 0 {
		dirs, _ = filepath.Glob("/sys/fs/cgroup/pids/kubepods*/pod" + string(pods.Items[0].UID))
	}
	if len(dirs) != 1 {
		t.Skipf("the pod's pids cgroup is not on this machine (%v)", dirs)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dirs[0], name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if got := read("pids.max"); got != "1024" {
		t.Fatalf("the pod's pids.max on the node: %s, want the kubelet's 1024", got)
	}
	// Forks refused by the limit: pids.events of the pod's cgroup and its
	// containers' (a kernel before 6.2 counts a refusal in the cgroup of
	// the task that forked, not in the one whose limit it met).
	refused := func() int {
		files, _ := filepath.Glob(filepath.Join(dirs[0], "*", "pids.events"))
		n := 0
		for _, f := range append(files, filepath.Join(dirs[0], "pids.events")) {
			b, _ := os.ReadFile(f)
			v, _ := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(string(b)), "max "))
			n += v
		}
		return n
	}
	before := refused()

	// The bomb: 3000 background processes, far past the limit. The shell
	// ends (exit 2) at the first fork the limit refuses.
	bomb := `i=0; while [ $i -lt 3000 ]; do sleep 15 </dev/null >/dev/null 2>&1 & i=$((i+1)); done`
	start := time.Now()
	res := s.call("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", bomb}, "timeout_ms": 60000})
	t.Logf("the bomb (%v): %.300s; the pod's pids.current %s", time.Since(start).Round(time.Millisecond), text(res), read("pids.current"))
	if n := refused(); n <= before {
		t.Errorf("pids.events max %d after the bomb (before: %d): the pod's limit refused no fork", n, before)
	}
	if cur, _ := strconv.Atoi(read("pids.current")); cur > 1024 {
		t.Errorf("pids.current %d, above the limit", cur)
	}
	// The node is fine: another sandbox starts and runs while the bomb's
	// processes still live, and this one answers again once they end.
	other := startServer(t, serverOpts{args: k.args()})
	if r := other.ok("sandbox_exec", map[string]any{"argv": []string{"echo", "alive"}}); r["stdout"] != "alive\n" {
		t.Errorf("another sandbox during the bomb: %v", r)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := s.call("sandbox_exec", map[string]any{"argv": []string{"echo", "back"}})
		if !r.IsError {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bombed sandbox never answered again: %s", text(r))
		}
		time.Sleep(time.Second)
	}
}

// grepLine returns the lines of s that contain sub.
func grepLine(s, sub string) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
