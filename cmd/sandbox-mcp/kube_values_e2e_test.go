package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-mcp/sandbox-mcp/session/backend/kube"
)

// TestKubePodSpecHoldsNoValues (issue 18 item 8): with --env, a secret and
// the allowlist, a sandbox pod read back through the API (what anyone who
// may get pods sees, what etcd keeps) holds none of the --env value, the
// secret's placeholder, the proxy credential or the proxy URL, while the
// sandbox's commands get all of them and egress through the proxy works.
func TestKubePodSpecHoldsNoValues(t *testing.T) {
	k := newKubeEnv(t)
	const nodeIP = "100.72.0.1"
	const envValue = "env-value-7d1e9c0b2a"
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	go func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello from target\n"))
			c.Close()
		}
	}()
	tport := target.Addr().(*net.TCPAddr).Port
	pl, err := net.Listen("tcp", nodeIP+":0") // a free port for the proxy
	if err != nil {
		t.Skipf("cannot listen on the node's pod-network address: %v", err)
	}
	proxy := pl.Addr().String()
	pl.Close()

	s := startServer(t, serverOpts{
		args: k.args("--network", "allowlist", "--allow-host", fmt.Sprintf("localhost:%d", tport),
			"--allow-host", "secret.example.com:443", "--secret", "TOKEN@secret.example.com",
			"--allow-private-networks", "--proxy-listen", proxy, "--proxy-advertise", proxy,
			"--env", "GREETING="+envValue),
		env: []string{"TOKEN=the-real-secret-value"},
	})
	script := fmt.Sprintf(`echo "$GREETING"; echo "$TOKEN"; echo "$HTTPS_PROXY"
p=${HTTPS_PROXY#http://}; cred=${p%%@*}; hp=${p#*@}
auth=$(printf %%s "$cred" | base64)
printf 'CONNECT localhost:%[1]d HTTP/1.1\r\nHost: localhost:%[1]d\r\nProxy-Authorization: Basic %%s\r\n\r\n' "$auth" | nc -w 3 ${hp%%:*} ${hp##*:}`, tport)
	out := s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", script}, "timeout_ms": 30000})
	lines := strings.Split(out["stdout"].(string), "\n")
	if len(lines) < 4 || lines[0] != envValue || !strings.HasPrefix(lines[1], "sbx-secret-TOKEN-") || !strings.Contains(lines[2], "@"+proxy) {
		t.Fatalf("the sandbox's environment:\n%v", out)
	}
	if !strings.Contains(out["stdout"].(string), "200") || !strings.Contains(out["stdout"].(string), "hello from target") {
		t.Fatalf("egress through the proxy with the credential:\n%v", out)
	}
	placeholder, proxyURL := lines[1], lines[2]
	cred := strings.TrimPrefix(strings.SplitN(proxyURL, "@", 2)[0], "http://sbx:")
	if len(cred) < 16 {
		t.Fatalf("the credential in %q", proxyURL)
	}

	pods, err := k.cs.CoreV1().Pods(k.ns).List(context.Background(), metav1.ListOptions{LabelSelector: kube.LabelSandbox + "=" + out["sandbox"].(string)})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the sandbox's pod: %v %v", pods, err)
	}
	raw, err := json.Marshal(pods.Items[0])
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"the --env value": envValue, "the placeholder": placeholder,
		"the proxy credential": cred, "the secret's value": "the-real-secret-value", "the proxy URL": "sbx:"} {
		if strings.Contains(string(raw), v) {
			t.Errorf("the pod as the API shows it holds %s (%q)", name, v)
		}
	}
	for _, c := range pods.Items[0].Spec.Containers {
		if len(c.Env) != 0 || len(c.EnvFrom) != 0 {
			t.Errorf("container %s has env in its spec: %v %v", c.Name, c.Env, c.EnvFrom)
		}
	}
	// Nor does the pod's pid 1 (hold) carry them: the sandbox's commands
	// got them from the agent.
	env1 := s.ok("sandbox_exec", map[string]any{"argv": []string{"sh", "-c", "tr '\\0' '\\n' </proc/1/environ"}})
	if strings.Contains(env1["stdout"].(string), envValue) || strings.Contains(env1["stdout"].(string), cred) {
		t.Errorf("pid 1's environment holds the values:\n%s", env1["stdout"])
	}
}
