package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// testNetworkPool returns a /22 of the default pool for one test server, so
// that the firewall rules of its networks (which name their gateways) can
// be told from those of other servers on the engine.
func testNetworkPool() netip.Prefix {
	var b [2]byte
	rand.Read(b[:])
	n := binary.BigEndian.Uint16(b[:]) % 128 // /22s of 198.19.0.0/16
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, byte(n * 4), 0}), 22)
}

var instanceRe = regexp.MustCompile(`instance=(srv-[0-9a-f]+)`)

// serverInstance returns the instance id a server logged at its start.
func serverInstance(t *testing.T, stderr *syncBuffer) string {
	t.Helper()
	m := instanceRe.FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no instance id in the server's log:\n%s", stderr)
	}
	return m[1]
}

var ipv4Re = regexp.MustCompile(`\b\d+\.\d+\.\d+\.\d+\b`)

// leftByServer lists what a server that has stopped left behind: the
// containers and networks that carry its instance label, and the firewall
// rules that name an address of its network pool.
func leftByServer(t *testing.T, cli *client.Client, instance string, pool netip.Prefix) []string {
	t.Helper()
	left := testenv.Containers(t, cli, docker.LabelInstance, instance)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nets, err := cli.NetworkList(ctx, client.NetworkListOptions{Filters: make(client.Filters).Add("label", docker.LabelInstance+"="+instance)})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nets.Items {
		left = append(left, "network "+n.Name)
	}
	out, _ := exec.Command("nft", "list", "table", "inet", docker.FirewallTable).Output()
	for _, line := range strings.Split(string(out), "\n") {
		for _, a := range ipv4Re.FindAllString(line, -1) {
			if addr, err := netip.ParseAddr(a); err == nil && pool.Contains(addr) {
				left = append(left, "rule "+strings.TrimSpace(line))
				break
			}
		}
	}
	return left
}

// cleanupServer removes what a server left behind, so that a failing test
// leaves nothing either.
func cleanupServer(cli *client.Client, instance string) {
	testenv.RemoveLabelled(cli, docker.LabelInstance, instance)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nets, _ := cli.NetworkList(ctx, client.NetworkListOptions{Filters: make(client.Filters).Add("label", docker.LabelInstance+"="+instance)})
	for _, n := range nets.Items {
		cli.NetworkRemove(ctx, n.ID, client.NetworkRemoveOptions{})
	}
}

// TestHTTPCancelledStartsLeaveNothing: sessions whose first call is
// abandoned while its sandbox starts, by an HTTP DELETE of the session or
// by the client dropping the POST that carries the call, at moments spread
// over a start, leave nothing behind once the server has stopped: no
// container, no network, no firewall rule of the server's.
func TestHTTPCancelledStartsLeaveNothing(t *testing.T) {
	pool := testNetworkPool()
	s := startHTTP(t, httpOpts{args: []string{"--network", "allowlist", "--allow-host", "api.test:443", "--network-pool", pool.String()}})
	instance := serverInstance(t, s.stderr)
	t.Cleanup(func() { cleanupServer(s.cli, instance) })

	// A start's length here, to spread the cancels over.
	c := s.connect("")
	begin := time.Now()
	c.ok("sandbox_exec", map[string]any{"argv": []string{"true"}})
	start := time.Since(begin)
	c.cs.Close()
	t.Logf("a start (and one call) took %s", start.Round(time.Millisecond))

	const deletes, drops = 12, 6
	call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"sandbox_exec","arguments":{"argv":["true"]}}}`
	var wg sync.WaitGroup
	errs := make(chan error, deletes+drops)
	for i := range deletes + drops {
		delay := start * time.Duration(i%deletes) / deletes
		wg.Go(func() {
			r, err := s.rawPost(nil, initializeBody)
			sid := r.header.Get("Mcp-Session-Id")
			if err != nil || r.status != http.StatusOK || sid == "" {
				errs <- fmt.Errorf("initialize: %d %v", r.status, err)
				return
			}
			h := http.Header{"Mcp-Session-Id": {sid}, "Mcp-Protocol-Version": {"2025-11-25"}}
			if r, err := s.rawPost(h, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); err != nil || r.status != http.StatusAccepted {
				errs <- fmt.Errorf("initialized: %d %v", r.status, err)
				return
			}
			if i >= deletes {
				// The client sends the call and drops the connection.
				conn, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
				if err != nil {
					errs <- err
					return
				}
				fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: %s\r\nMcp-Protocol-Version: 2025-11-25\r\nContent-Length: %d\r\n\r\n%s",
					strings.TrimPrefix(s.base, "http://"), sid, len(call), call)
				time.Sleep(delay)
				conn.Close()
				return
			}
			called := make(chan struct{})
			go func() {
				defer close(called)
				s.rawPost(h, call) // ends with the session, however
			}()
			time.Sleep(delay)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, s.url, nil)
			req.Header = h.Clone()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				errs <- fmt.Errorf("DELETE: %v", err)
				return
			}
			resp.Body.Close()
			<-called
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("containers started in all: %d (of %d first calls, all abandoned)", strings.Count(s.stderr.String(), `msg="sandbox started"`)-1, deletes+drops)

	if !s.stop(time.Minute) {
		t.Fatal("the server did not stop within a minute of SIGTERM")
	}
	if left := leftByServer(t, s.cli, instance, pool); len(left) > 0 {
		t.Fatalf("the server left behind:\n%s", strings.Join(left, "\n"))
	}
}

// TestStdioCancelledStartsLeaveNothing: calls that the client cancels
// (notifications/cancelled, from the go-sdk client) while the session's
// sandbox starts, at moments spread over a start, leave nothing behind
// once the server has stopped.
func TestStdioCancelledStartsLeaveNothing(t *testing.T) {
	pool := testNetworkPool()
	s := startServer(t, serverOpts{args: []string{"--network", "allowlist", "--allow-host", "api.test:443", "--network-pool", pool.String()}})
	instance := serverInstance(t, s.stderr)
	t.Cleanup(func() { cleanupServer(s.cli, instance) })

	cancelled := 0
	for _, delay := range []time.Duration{0, 10, 25, 50, 100, 150, 200, 300, 400, 600, 800, 1000, 1500, 2000, 3000, 5000} {
		ctx, cancel := context.WithCancel(context.Background())
		timer := time.AfterFunc(delay*time.Millisecond, cancel)
		_, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"argv": []string{"true"}}})
		timer.Stop()
		cancel()
		if err == nil {
			break // the sandbox started before the cancel
		}
		cancelled++
	}
	t.Logf("%d calls cancelled while the sandbox started", cancelled)
	if cancelled == 0 {
		t.Fatal("no call was cancelled while the sandbox started")
	}
	done := make(chan error, 1)
	go func() { done <- s.cs.Close() }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the server did not exit within a minute of its stdin closing")
	}
	if left := leftByServer(t, s.cli, instance, pool); len(left) > 0 {
		t.Fatalf("the server left behind:\n%s", strings.Join(left, "\n"))
	}
}
