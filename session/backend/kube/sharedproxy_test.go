package kube

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// TestSharedProxyOnePodCannotBlockAnother (issue 18 item 8): two sandbox
// pods on the test node share the server's proxy listener; pod A holds 100
// connections to it open without a byte, and pod B's requests, with its
// credential, still go through. Each pod's environment (the proxy URL with
// its credential) reaches it through the agent's setup, not its spec.
func TestSharedProxyOnePodCannotBlockAnother(t *testing.T) {
	rc := testNode(t)
	ns := testNamespace(t, rc)
	const nodeIP = "100.72.0.1"
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
	pl, err := net.Listen("tcp", nodeIP+":0")
	if err != nil {
		t.Skipf("cannot listen on the node's pod-network address: %v", err)
	}
	paddr := pl.Addr().(*net.TCPAddr)
	pl.Close()

	allow, err := netproxy.ParseAllowlist([]string{fmt.Sprintf("localhost:%d", tport)})
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := netproxy.New(netproxy.Config{Allow: allow, AllowPrivate: true})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCluster(rc, Config{Namespace: ns, Instance: "srv-shared", AgentImage: testAgentImage(t),
		PullPolicy: corev1.PullNever, LeaseDuration: 6 * time.Second, StartTimeout: 90 * time.Second,
		Proxy: &Proxy{Port: paddr.Port, CIDR: nodeIP + "/32"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := c.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := NewBackend(BackendConfig{Cluster: c, Image: sandboxParams("").Image,
		ProxyListen: paddr.String(), ProxyAdvertise: paddr.String()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close(context.Background()) })

	type pod struct {
		r *agentproto.Reader
		w *agentproto.Writer
	}
	start := func(sandbox string) pod {
		spec := instanceSpec(sandbox, 1)
		spec.Proxy = proxy
		inst, err := b.Start(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { inst.Remove(context.Background()) })
		p := pod{agentproto.NewReader(inst.Stdout()), agentproto.NewWriter(inst.Stdin())}
		if f, err := p.r.Read(); err != nil || f.Kind != agentproto.KindHello {
			t.Fatalf("first frame %v %v", f.Kind, err)
		}
		env := inst.(backend.AgentEnv).AgentEnv()
		if err := p.w.Write(1, agentproto.KindSetup, agentproto.SetupRequest{Env: env}, nil); err != nil {
			t.Fatal(err)
		}
		f, err := p.r.Read()
		var res agentproto.SetupResult
		if err != nil || f.Kind != agentproto.KindResult || f.Decode(&res) != nil || res.Env != len(env) {
			t.Fatalf("setup: %v %v %+v", f.Kind, err, res)
		}
		return p
	}
	a, bp := start("sb-idle"), start("sb-busy")

	// Pod A: 100 connections to the proxy, each kept open by a sleep that
	// sends nothing.
	out, res := agentExec(t, a.r, a.w, 2, agentproto.ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf(
		`i=0; while [ $i -lt 100 ]; do (sleep 20 | nc %s %d >/dev/null 2>&1 &); i=$((i+1)); done; sleep 2; echo held`, nodeIP, paddr.Port)},
		Cwd: ".", MaxOutput: 4096, TimeoutMillis: 30000})
	if res.ExitCode != 0 || !strings.Contains(out, "held") {
		t.Fatalf("pod A: %d %s", res.ExitCode, out)
	}
	// Pod B, meanwhile: three requests with its credential.
	script := fmt.Sprintf(`p=${HTTPS_PROXY#http://}; cred=${p%%@*}; hp=${p#*@}
auth=$(printf %%s "$cred" | base64)
for i in 1 2 3; do
printf 'CONNECT localhost:%[1]d HTTP/1.1\r\nHost: localhost:%[1]d\r\nProxy-Authorization: Basic %%s\r\n\r\n' "$auth" | nc -w 3 ${hp%%:*} ${hp##*:}
echo ---
done`, tport)
	out, res = agentExec(t, bp.r, bp.w, 2, agentproto.ExecRequest{Argv: []string{"sh", "-c", script}, Cwd: ".", MaxOutput: 16 << 10, TimeoutMillis: 30000})
	if n := strings.Count(out, "hello from target"); n != 3 || res.ExitCode != 0 {
		t.Fatalf("pod B's requests while pod A holds 100 idle connections: %d of 3 went through:\n%s", n, out)
	}
}
