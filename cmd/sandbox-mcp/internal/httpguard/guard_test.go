package httpguard

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func TestNormalizeOriginAndHost(t *testing.T) {
	for in, want := range map[string]string{
		"https://Tools.Example":       "https://tools.example",
		"https://tools.example:443":   "https://tools.example",
		"http://tools.example:80/":    "http://tools.example",
		"http://127.0.0.1:8080":       "http://127.0.0.1:8080",
		"https://tools.example:8443":  "https://tools.example:8443",
		"http://[::1]:80":             "http://[::1]",
		"HTTP://LOCALHOST:3000":       "http://localhost:3000",
		"https://xn--bcher-kva.tld:1": "https://xn--bcher-kva.tld:1",
	} {
		if got, err := NormalizeOrigin(in); err != nil || got != want {
			t.Errorf("NormalizeOrigin(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"null", "*", "", "tools.example", "https://", "https://u:p@tools.example", "https://tools.example/x", "https://tools.example?q", "file:///etc"} {
		if got, err := NormalizeOrigin(bad); err == nil {
			t.Errorf("NormalizeOrigin(%q) = %q, want an error", bad, got)
		}
	}
	for in, want := range map[string]string{
		"localhost:8080": "localhost", "LOCALHOST": "localhost", "Example.COM.": "example.com",
		"[::1]:80": "::1", "[::1]": "::1", "127.0.0.1:1": "127.0.0.1", "mcp.example.com": "mcp.example.com",
	} {
		if got, err := NormalizeHostName(in); err != nil || got != want {
			t.Errorf("NormalizeHostName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "a/b", "user@host", "host name", ":80", "[]"} {
		if got, err := NormalizeHostName(bad); err == nil {
			t.Errorf("NormalizeHostName(%q) = %q, want an error", bad, got)
		}
	}
}

// TestGuardDecisions checks the Host and Origin decisions for servers on a
// loopback, a network and an every-interface address.
func TestGuardDecisions(t *testing.T) {
	o := Options{
		AllowOrigins: []string{"https://tools.example"},
		AllowHosts:   []string{"mcp.example.com:443"},
		MaxSessions:  1, SessionsPerCaller: 1, CallsPerCaller: 1,
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "t", Version: "0"}, nil)
	newG := func(listen string) *Guard {
		o.Addr = listen
		host, port, _ := net.SplitHostPort(listen)
		o.Listen, _ = net.ResolveTCPAddr("tcp", net.JoinHostPort(host, port))
		g, err := New(o, srv, nil)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	loop := newG("127.0.0.1:8080")
	for host, want := range map[string]bool{
		"127.0.0.1:8080": true, "localhost:8080": true, "LOCALHOST": true, "[::1]:8080": true, "mcp.example.com": true,
		"MCP.example.com.:8443": true, "evil.com": false, "localhost.evil.com": false, "127.0.0.1.nip.io:8080": false,
		"": false, "192.0.2.10:8080": false, "mcp.example.com.evil.net": false,
	} {
		if got := loop.hostAllowed(host); got != want {
			t.Errorf("loopback: hostAllowed(%q) = %v, want %v", host, got, want)
		}
	}
	network := newG("192.0.2.10:8080")
	if !network.hostAllowed("192.0.2.10:8080") || network.hostAllowed("rebind.attacker.example:8080") || network.hostAllowed("192.0.2.11:8080") {
		t.Error("network listener: wrong Host decisions")
	}
	named := newG("localhost:8080")
	if !named.hostAllowed("localhost:8080") || !named.hostAllowed("127.0.0.1:8080") {
		t.Error("a listener named by host name: wrong Host decisions")
	}
	for _, tc := range []struct {
		origins []string
		host    string
		want    bool
	}{
		{[]string{"https://tools.example"}, "127.0.0.1:8080", true},
		{[]string{"https://TOOLS.example:443"}, "127.0.0.1:8080", true},
		{[]string{"http://127.0.0.1:8080"}, "127.0.0.1:8080", true},
		{[]string{"https://mcp.example.com"}, "mcp.example.com", true},
		{[]string{"http://127.0.0.1:8081"}, "127.0.0.1:8080", false},
		{[]string{"https://evil.example"}, "127.0.0.1:8080", false},
		{[]string{"null"}, "127.0.0.1:8080", false},
		{[]string{""}, "127.0.0.1:8080", false},
		{[]string{"https://tools.example", "https://evil.example"}, "127.0.0.1:8080", false},
		{[]string{"https://tools.example.evil.net"}, "127.0.0.1:8080", false},
	} {
		if got := loop.originAllowed(tc.origins, tc.host); got != tc.want {
			t.Errorf("originAllowed(%q, %q) = %v, want %v", tc.origins, tc.host, got, tc.want)
		}
	}
}

// TestMaxRequestBody: the cap fits the largest write in base64 with its
// envelope, and is not much larger.
func TestMaxRequestBody(t *testing.T) {
	for _, max := range []int64{1 << 20, 8 << 20, 64 << 20} {
		content := strings.Repeat("A", int((max+2)/3*4))
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{
			"name": "sandbox_write_file", "arguments": map[string]any{"path": strings.Repeat("d/", 100) + "f", "content": content, "encoding": "base64", "mode": "0644"}}})
		got := MaxRequestBody(max)
		if int64(len(body)) > got {
			t.Errorf("max-file-bytes %d: a largest write is %d bytes, over the cap %d", max, len(body), got)
		}
		if got > max*3/2+2<<20 {
			t.Errorf("max-file-bytes %d: cap %d is loose", max, got)
		}
	}
}
