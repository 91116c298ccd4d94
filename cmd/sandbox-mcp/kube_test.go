package main

import (
	"strings"
	"testing"
)

// TestKubeFlags: the Kubernetes flags parse, and each missing piece is an
// error that names the flag to set.
func TestKubeFlags(t *testing.T) {
	env := envFrom(map[string]string{"HOME": "/home/u"})
	cfg, err := ParseConfig([]string{"--backend", "kubernetes", "--namespace", "sbx", "--agent-image", "a:1",
		"--runtime-class", "gvisor", "--pull-policy", "Never", "--kubeconfig", "/k", "--seccomp-localhost-profile", "sandbox-mcp/p.json"}, env)
	if err != nil {
		t.Fatal(err)
	}
	k := cfg.Kube
	if k.Backend != BackendKubernetes || k.Namespace != "sbx" || k.AgentImage != "a:1" || k.RuntimeClass != "gvisor" || k.PullPolicy != "Never" || k.Kubeconfig != "/k" || k.SeccompLocalhost != "sandbox-mcp/p.json" {
		t.Errorf("%+v", k)
	}
	if d, _ := ParseConfig(nil, env); d.Kube.Backend != BackendDocker {
		t.Errorf("default backend %q", d.Kube.Backend)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--backend", "kubernetes", "--agent-image", "a"}, "--namespace"},
		{[]string{"--backend", "kubernetes", "--namespace", "n"}, "--agent-image"},
		{[]string{"--namespace", "n"}, "need --backend kubernetes"},
		{[]string{"--backend", "podman"}, "backend"},
		{[]string{"--backend", "kubernetes", "--namespace", "n", "--agent-image", "a", "--network", "allowlist", "--allow-host", "x.org"}, "--proxy-advertise"},
		{[]string{"--backend", "kubernetes", "--namespace", "n", "--agent-image", "a", "--network", "allowlist", "--allow-host", "x.org",
			"--proxy-listen", ":3128", "--proxy-advertise", "proxy.local:3128"}, "IP address"},
		{[]string{"--backend", "kubernetes", "--namespace", "n", "--agent-image", "a", "--runtime", "runsc"}, "--runtime-class"},
		{[]string{"--seccomp-localhost-profile", "p.json"}, "need --backend kubernetes"},
		{[]string{"--backend", "kubernetes", "--namespace", "n", "--agent-image", "a", "--seccomp-localhost-profile", "/var/lib/kubelet/seccomp/p.json"}, "relative to the kubelet's seccomp directory"},
		{[]string{"--backend", "kubernetes", "--namespace", "n", "--agent-image", "a", "--seccomp-localhost-profile", "../p.json"}, "clean path"},
	} {
		_, err := ParseConfig(tc.args, env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
	p, err := advertisedProxy("100.72.0.1:3128")
	if err != nil || p.CIDR != "100.72.0.1/32" || p.Port != 3128 {
		t.Errorf("advertisedProxy: %+v %v", p, err)
	}
}
