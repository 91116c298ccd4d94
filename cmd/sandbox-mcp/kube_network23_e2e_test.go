package main

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
)

// TestKubePreview: on the test node, busybox's httpd in a pod sandbox with
// no network, reached through the preview URL (--preview-listen, the
// agent's stream); a second port is not reachable through it, and a
// revoked preview is 404 as a wrong token is.
func TestKubePreview(t *testing.T) {
	k := newKubeEnv(t)
	s := startServer(t, serverOpts{protocol: "2025-11-25", args: k.args("--preview-listen", "127.0.0.1:0")})
	s.ok("sandbox_write_file", map[string]any{"path": "site/hello-preview.txt", "content": "hi from the pod"})
	s.ok("sandbox_write_file", map[string]any{"path": "other/secret-8001.txt", "content": "no"})
	s.ok("sandbox_exec", map[string]any{"command": "httpd -f -p 127.0.0.1:8000 -h /workspace/site", "background": true})
	s.ok("sandbox_exec", map[string]any{"command": "httpd -f -p 127.0.0.1:8001 -h /workspace/other", "background": true})
	u := exposeListening(s, map[string]any{"port": 8000, "wait_ms": 20000, "path": "hello-preview.txt"})
	if code, body := httpGet(t, u, nil); code != 200 || body != "hi from the pod" {
		t.Fatalf("GET %s: %d %q", u, code, body)
	}
	p, _ := url.Parse(u)
	base := p.Scheme + "://" + p.Host
	token := strings.Split(strings.TrimPrefix(p.Path, "/preview/"), "/")[0]
	for _, path := range []string{"/preview/" + token + "/secret-8001.txt", "/preview/" + token + "/%2e%2e/other/secret-8001.txt",
		"/preview/" + token + ":8001/secret-8001.txt", "/preview/8001/secret-8001.txt"} {
		if _, body := httpGet(t, base+path, nil); body == "no" {
			t.Fatalf("%s reached the server on 8001: %q", path, body)
		}
	}
	wrongCode, wrong := httpGet(t, base+"/preview/"+strings.Repeat("x", len(token))+"/", nil)
	if wrongCode != 404 {
		t.Fatalf("a wrong token: %d", wrongCode)
	}
	if n := s.ok("sandbox_expose", map[string]any{"port": 8000, "revoke": true})["revoked"]; n != float64(1) {
		t.Fatalf("revoked %v", n)
	}
	if code, body := httpGet(t, u, nil); code != 404 || body != wrong {
		t.Fatalf("revoked: %d %q, want 404 %q", code, body, wrong)
	}
}

// TestKubeApproval: on the test node, a pod sandbox with an allowlist is
// refused an unlisted host; the person allows it and the pod then reaches
// it through the proxy; with another server whose person denies, it stays
// refused.
func TestKubeApproval(t *testing.T) {
	k := newKubeEnv(t)
	const nodeIP = "100.72.0.1"
	name, port := approvalUpstream(t)
	target := fmt.Sprintf("%s:%d", name, port)
	proxyArgs := func() []string {
		pl, err := net.Listen("tcp", nodeIP+":0")
		if err != nil {
			t.Skipf("cannot listen on the node's pod-network address: %v", err)
		}
		proxy := pl.Addr().String()
		pl.Close()
		return []string{"--proxy-listen", proxy, "--proxy-advertise", proxy}
	}
	for _, tc := range []struct{ decision, want string }{{"allow", "200"}, {"deny", "403"}} {
		t.Run(tc.decision, func(t *testing.T) {
			audit := t.TempDir() + "/audit.jsonl"
			a := &answerer{action: "accept", decision: tc.decision}
			s := startServer(t, serverOpts{protocol: "2025-11-25", elicit: a.handle,
				args: k.args(append(approvalArgs(target, audit), proxyArgs()...)...)})
			out := connectThrough(s, target)
			if !strings.Contains(out["stdout"].(string), "403") || a.asked.Load() != 1 {
				t.Fatalf("first CONNECT (asked %d): %v", a.asked.Load(), out)
			}
			if approved := firstDenied(t, out)["approved"] == true; approved != (tc.decision == "allow") {
				t.Fatalf("result after %s: %v", tc.decision, out)
			}
			out = connectThrough(s, target)
			if !strings.Contains(out["stdout"].(string), tc.want) {
				t.Fatalf("CONNECT after %s: %v, want %s", tc.decision, out, tc.want)
			}
			if a.asked.Load() != 1 {
				t.Errorf("asked %d times, want 1", a.asked.Load())
			}
			sb := out["sandbox"].(string)
			if pods := k.pods(t, sb); len(pods) != 1 {
				t.Fatalf("pods of %s: %v", sb, pods)
			}
		})
	}
}
