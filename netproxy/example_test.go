package netproxy_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"

	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
)

func ExampleParseAllowlist() {
	allow, err := netproxy.ParseAllowlist([]string{"API.example.com.", "*.pkg.example.org:8443"})
	if err != nil {
		panic(err)
	}
	fmt.Println(allow.Entries())
	fmt.Println(allow.Match("api.example.com", 443))
	fmt.Println(allow.Match("a.b.pkg.example.org", 8443))
	fmt.Println(allow.Match("pkg.example.org", 8443)) // a wildcard does not cover its apex

	_, err = netproxy.ParseAllowlist([]string{"*example.com"})
	fmt.Println(err)
	// Output:
	// [api.example.com:443 *.pkg.example.org:8443]
	// api.example.com:443 true
	// *.pkg.example.org:8443 true
	//  false
	// allowlist entry "*example.com": a wildcard may only be a whole first label: use "*.example.com"
}

func ExampleClassify() {
	for _, s := range []string{"93.184.216.34", "169.254.169.254", "::ffff:127.0.0.1", "64:ff9b::808:808", "100.64.0.1"} {
		fmt.Printf("%s %q\n", s, netproxy.Classify(netip.MustParseAddr(s)))
	}
	// Output:
	// 93.184.216.34 ""
	// 169.254.169.254 "metadata"
	// ::ffff:127.0.0.1 "loopback"
	// 64:ff9b::808:808 "nat64"
	// 100.64.0.1 "cgnat"
}

// One Proxy serves every sandbox; each sandbox gets its own listener.
func ExampleProxy_Serve() {
	allow, err := netproxy.ParseAllowlist([]string{"api.github.com", "*.pypi.org"})
	if err != nil {
		panic(err)
	}
	p, err := netproxy.New(netproxy.Config{
		Allow:  allow,
		Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil)),
	})
	if err != nil {
		panic(err)
	}
	// In the server this is the gateway address of the sandbox's network.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go p.Serve(ctx, ln, "sandbox-7f3a") // HTTPS_PROXY=http://<ln.Addr()> inside the sandbox
	cancel()                            // when the sandbox goes away
}
