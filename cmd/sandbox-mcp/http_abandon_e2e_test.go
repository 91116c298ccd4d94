package main

import (
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestHTTPAbandonedCallEnds: a client that drops the POST carrying a call
// (closes the connection, sending no notifications/cancelled) ends the
// call: its command is killed and its --max-execs slot is free again,
// long before the command's own timeout.
func TestHTTPAbandonedCallEnds(t *testing.T) {
	s := startHTTP(t, httpOpts{args: []string{"--max-execs", "2"}})
	sid := s.initialize(nil)
	h := http.Header{"Mcp-Session-Id": {sid}, "Mcp-Protocol-Version": {"2025-11-25"}}
	if r := s.do(http.MethodPost, "", h, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); r.status != http.StatusAccepted {
		t.Fatalf("initialized: %d %s", r.status, r.body)
	}
	exec := func(id int, argv string) string {
		r := s.do(http.MethodPost, "", h, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"sandbox_exec","arguments":{"argv":%s}}}`, id, argv))
		if r.status != http.StatusOK {
			t.Fatalf("call: %d %s", r.status, r.body)
		}
		return r.body
	}
	exec(2, `["true"]`) // the sandbox exists

	// The abandoned call, on a connection of its own.
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"sandbox_exec","arguments":{"argv":["sleep","1000"],"timeout_ms":600000}}}`
	fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: %s\r\nMcp-Protocol-Version: 2025-11-25\r\nContent-Length: %d\r\n\r\n%s",
		strings.TrimPrefix(s.base, "http://"), sid, len(body), body)

	ps := func(id int) bool {
		return strings.Contains(exec(id, `["sh","-c","ps -o args | grep '[s]leep 1000' || true"]`), "sleep 1000")
	}
	deadline := time.Now().Add(30 * time.Second)
	for id := 10; !ps(id); id++ {
		if time.Now().After(deadline) {
			t.Fatal("the sleep never ran")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A client that sent its request and reads nothing more: what came
	// back so far does not matter.
	conn.Close()
	start := time.Now()
	deadline = time.Now().Add(30 * time.Second)
	for id := 100; ps(id); id++ {
		if time.Now().After(deadline) {
			t.Fatal("the command of the abandoned call still runs 30s after its client went away")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("command gone %s after the client closed the connection", time.Since(start).Round(time.Millisecond))
	// The call has ended, its slot given back before it is logged.
	for !regexp.MustCompile(`msg="tool call" tool=sandbox_exec .*decision=deny .*reason=cancelled`).MatchString(s.stderr.String()) {
		if time.Now().After(deadline) {
			t.Fatal("the abandoned call was not logged as cancelled")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
