package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/kube"
)

// TestKubeTemplates (issue 22 §3): every key of an operator's template
// shapes its sandbox pods on the Kubernetes backend as on Docker: the
// image, memory and CPU limits, the workspace size, the environment (in
// place of --env, never in the pod spec), the seed, read-only, the exec
// policy, and the network (none: the isolation label; the allowlist: the
// template's own hosts at the shared proxy). doctor checks each template
// image by a pod of it, and a template image the node lacks is a FAIL
// (doctor) and an UNAVAILABLE naming the template (a call).
func TestKubeTemplates(t *testing.T) {
	k := newKubeEnv(t)
	// The big template's image: the test image under a name of its own,
	// loaded into the node as an operator would (make k8s-images IMAGE).
	big := "sandbox-mcp-test-template:" + strings.TrimPrefix(testenv.TestImage(t), "sandbox-mcp-test:")
	if _, err := testenv.Engine(t).ImageTag(context.Background(), client.ImageTagOptions{Source: testenv.TestImage(t), Target: big}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = testenv.Engine(t).ImageRemove(context.Background(), big, client.ImageRemoveOptions{}) // the tag; the node keeps its copy
	})
	if out, err := exec.Command("bash", filepath.Join(testenv.RepoRoot(), "hack", "k8s-images.sh"), big).CombinedOutput(); err != nil {
		t.Fatalf("hack/k8s-images.sh %s: %v\n%s", big, err, out)
	}
	const nodeIP = "100.72.0.1"
	listen := func() (net.Listener, int) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Write([]byte("hello from target\n"))
				c.Close()
			}
		}()
		return l, l.Addr().(*net.TCPAddr).Port
	}
	_, defPort := listen() // the default's host
	_, tplPort := listen() // the "net" template's host
	pl, err := net.Listen("tcp", nodeIP+":0")
	if err != nil {
		t.Skipf("cannot listen on the node's pod-network address: %v", err)
	}
	proxy := pl.Addr().String()
	pl.Close()

	seed := t.TempDir()
	if err := os.WriteFile(filepath.Join(seed, "seeded.txt"), []byte("from the seed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := "sandbox-mcp-test-not-on-node:0"
	file := writeConfig(t, t.TempDir(), fmt.Sprintf(`{"templates": {
		"big": {"image": %q, "memory": "384MiB", "cpus": 0.5, "max-workspace-bytes": "48MiB", "env": ["TPL=big"], "workspace-from": %q, "network": "none"},
		"locked": {"network": "none", "read-only": true, "exec": "allowlist", "allow-cmd": ["cat", "ls"]},
		"net": {"allow-host": ["localhost:%d"]},
		"gone": {"image": %q, "network": "none"}}}`, big, seed, tplPort, missing))
	args := k.args("--config", file, "--env", "DEF=1", "--network", "allowlist", "--allow-host", fmt.Sprintf("localhost:%d", defPort),
		"--allow-private-networks", "--proxy-listen", proxy, "--proxy-advertise", proxy)
	s := startServer(t, serverOpts{args: args})

	podOf := func(sandbox any) *corev1.Pod {
		t.Helper()
		list, err := k.cs.CoreV1().Pods(k.ns).List(context.Background(), metav1.ListOptions{LabelSelector: kube.LabelSandbox + "=" + sandbox.(string)})
		if err != nil || len(list.Items) != 1 {
			t.Fatalf("the pod of %v: %v %v", sandbox, list, err)
		}
		return &list.Items[0]
	}

	// big: its image, limits, workspace size, environment and seed.
	b := s.ok("sandbox_create", map[string]any{"template": "big"})["sandbox"]
	out := s.ok("sandbox_exec", map[string]any{"sandbox": b, "argv": []string{"sh", "-c",
		`cat seeded.txt; echo "TPL=$TPL DEF=${DEF:-unset}"; cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max; df -k /workspace | tail -1 | awk '{print $2}'`}})
	lines := strings.Split(strings.TrimSpace(out["stdout"].(string)), "\n")
	if len(lines) != 4 || lines[0] != "from the seed" || lines[1] != "TPL=big DEF=unset" || lines[2] != "402653184" || lines[3] != "49152" {
		t.Errorf("inside the big template's pod (seed, env, memory bytes, workspace KiB): %q", lines)
	}
	pod := podOf(b)
	c := pod.Spec.Containers[0]
	if c.Image != big || c.Resources.Limits.Memory().Value() != 384<<20 || c.Resources.Limits.Cpu().MilliValue() != 500 {
		t.Errorf("the big template's pod: image %s, limits %v", c.Image, c.Resources.Limits)
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == "workspace" && v.EmptyDir.SizeLimit.Value() != 48<<20 {
			t.Errorf("the big template's workspace volume: %v", v.EmptyDir.SizeLimit)
		}
	}
	if len(c.Env) != 0 || pod.Labels[kube.LabelNetwork] != kube.NetworkNone {
		t.Errorf("the big template's pod: env %v in its spec, network %s", c.Env, pod.Labels[kube.LabelNetwork])
	}

	// locked: a read-only mount, the exec allowlist, no network.
	l := s.ok("sandbox_create", map[string]any{"template": "locked"})["sandbox"]
	s.fails("sandbox_write_file", map[string]any{"sandbox": l, "path": "a.txt", "content": "x"}, "READ_ONLY")
	s.fails("sandbox_exec", map[string]any{"sandbox": l, "argv": []string{"sh", "-c", "true"}}, "POLICY_DENIED")
	env := s.ok("sandbox_exec", map[string]any{"sandbox": l, "argv": []string{"cat", "/proc/self/environ"}})["stdout"].(string)
	if strings.Contains(env, "PROXY") || !strings.Contains(env, "DEF=1") {
		t.Errorf("the locked template's environment (no proxy, the flags' --env): %q", env)
	}
	pod = podOf(l)
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		if m.MountPath == kube.WorkspaceDir && !m.ReadOnly {
			t.Error("the locked template's workspace is mounted writable")
		}
	}
	if pod.Labels[kube.LabelNetwork] != kube.NetworkNone {
		t.Errorf("the locked template's pod is on network %s", pod.Labels[kube.LabelNetwork])
	}

	// net: the template's own host at the shared proxy, not the default's.
	connect := func(sandbox any, port int) string {
		script := fmt.Sprintf(`p=${HTTPS_PROXY#http://}; cred=${p%%@*}; hp=${p#*@}
auth=$(printf %%s "$cred" | base64)
printf 'CONNECT localhost:%[1]d HTTP/1.1\r\nHost: localhost:%[1]d\r\nProxy-Authorization: Basic %%s\r\n\r\n' "$auth" | nc -w 3 ${hp%%:*} ${hp##*:}`, port)
		return s.ok("sandbox_exec", map[string]any{"sandbox": sandbox, "argv": []string{"sh", "-c", script}, "timeout_ms": 30000})["stdout"].(string)
	}
	n := s.ok("sandbox_create", map[string]any{"template": "net"})["sandbox"]
	if got := connect(n, tplPort); !strings.Contains(got, " 200 ") || !strings.Contains(got, "hello from target") {
		t.Errorf("the net template to its own host: %q", got)
	}
	if got := connect(n, defPort); strings.Contains(got, " 200 ") {
		t.Errorf("the net template reached the default's host: %q", got)
	}
	if got := connect(defaultSandbox(s), defPort); !strings.Contains(got, " 200 ") {
		t.Errorf("the default sandbox to its host: %q", got)
	}
	if podOf(n).Labels[kube.LabelNetwork] != kube.NetworkProxy {
		t.Error("the net template's pod is not on the proxy network")
	}

	// gone: its image is not on the node.
	g := s.ok("sandbox_create", map[string]any{"template": "gone"})["sandbox"]
	msg := s.fails("sandbox_exec", map[string]any{"sandbox": g, "argv": []string{"true"}}, "UNAVAILABLE")
	if !strings.Contains(msg, "template gone") || !strings.Contains(msg, "image "+missing+" is not on the node") {
		t.Errorf("a template whose image the node lacks: %s", msg)
	}

	s.cs.Close()
	k.waitNoPods(t, "", 60*time.Second)

	// doctor (after the server: it serves the same proxy address)
	// checks each template image with a pod of it.
	dout, err := exec.Command(bins.Get(t).Server, append([]string{"doctor", "--image", testenv.TestImage(t), "--state-dir", t.TempDir()}, args...)...).CombinedOutput()
	if err == nil {
		t.Errorf("doctor passed with a template image the node lacks:\n%s", dout)
	}
	for _, want := range []string{"ok    template big: image " + big, "FAIL  template gone: image " + missing + " is not on the node", `change the template's "image" in ` + file} {
		if !strings.Contains(string(dout), want) {
			t.Errorf("doctor lacks %q:\n%s", want, dout)
		}
	}
}

// defaultSandbox returns the server's default sandbox (its session's),
// started by a call.
func defaultSandbox(s *server) any {
	return s.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})["sandbox"]
}
