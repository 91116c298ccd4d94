package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawPost sends one JSON-RPC POST to /mcp, safe to call from any goroutine
// (it reports instead of failing the test).
func (s *httpServer) rawPost(hdr http.Header, body string) (reply, error) {
	req, err := http.NewRequest(http.MethodPost, s.url, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range hdr {
		req.Header[http.CanonicalHeaderKey(k)] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return reply{resp.StatusCode, resp.Header, string(b)}, nil
}

// liveSessions returns the ids among ids whose session still answers.
func (s *httpServer) liveSessions(hdr http.Header, ids []string) []string {
	s.t.Helper()
	var live []string
	for _, id := range ids {
		r := s.do(http.MethodPost, "", with(hdr, "Mcp-Session-Id", id), `{"jsonrpc":"2.0","id":99,"method":"ping"}`)
		switch r.status {
		case http.StatusOK:
			live = append(live, id)
		case http.StatusNotFound:
		default:
			s.t.Fatalf("ping of session %s: %d %s", id, r.status, r.body)
		}
	}
	return live
}

// initializeVariants are initialize requests spelled the ways a guard that
// parses bodies can misread: keys in other cases, duplicate keys in both
// orders, and batches (accepted without a protocol version header).
var initializeVariants = map[string]string{
	"plain":                  initializeBody,
	"extra Method key":       strings.Replace(initializeBody, `"method":"initialize"`, `"method":"initialize","Method":"x"`, 1),
	"extra METHOD key":       strings.Replace(initializeBody, `"method":"initialize"`, `"METHOD":"x","method":"initialize","METHOD":"y"`, 1),
	"duplicate, x last":      strings.Replace(initializeBody, `"method":"initialize"`, `"method":"initialize","method":"x"`, 1),
	"duplicate, x first":     strings.Replace(initializeBody, `"method":"initialize"`, `"method":"x","method":"initialize"`, 1),
	"batch of one":           "[" + initializeBody + "]",
	"batch behind a notice":  `[{"jsonrpc":"2.0","method":"notifications/x"},` + initializeBody + "]",
	"batch with Method keys": "[" + strings.Replace(initializeBody, `"method":"initialize"`, `"Method":"x","method":"initialize"`, 1) + "]",
}

// TestHTTPMaxSessionsHoldsWhateverTheBody: however an initialize is
// spelled, and however many arrive at once, no more than --max-sessions
// sessions live; refused requests get 503 with Retry-After, and room comes
// back when sessions end.
func TestHTTPMaxSessionsHoldsWhateverTheBody(t *testing.T) {
	const max = 3
	s := startHTTP(t, httpOpts{args: []string{"--max-sessions", fmt.Sprint(max)}})

	var (
		mu     sync.Mutex
		ids    []string
		errs   []error
		status = map[int]int{}
	)
	var wg sync.WaitGroup
	for round := range 4 {
		for name, body := range initializeVariants {
			for range 3 {
				wg.Go(func() {
					r, err := s.rawPost(nil, body)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						errs = append(errs, fmt.Errorf("round %d, %s: %w", round, name, err))
						return
					}
					status[r.status]++
					if id := r.header.Get("Mcp-Session-Id"); id != "" {
						ids = append(ids, id)
					}
					if r.status == http.StatusServiceUnavailable && r.header.Get("Retry-After") == "" {
						errs = append(errs, fmt.Errorf("%s: 503 without Retry-After", name))
					}
				})
			}
		}
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	live := s.liveSessions(nil, ids)
	t.Logf("%d requests: statuses %v, %d session ids handed out, %d live", 4*3*len(initializeVariants), status, len(ids), len(live))
	if len(live) > max {
		t.Fatalf("%d sessions live, above --max-sessions %d", len(live), max)
	}
	if status[http.StatusServiceUnavailable] == 0 {
		t.Fatal("no request was refused for the cap")
	}

	// Ending the sessions gives their room back, to the last place.
	for _, id := range live {
		if r := s.do(http.MethodDelete, "", with(nil, "Mcp-Session-Id", id), ""); r.status != http.StatusNoContent {
			t.Fatalf("DELETE %s: %d %s", id, r.status, r.body)
		}
	}
	var again []string
	for range max {
		again = append(again, s.initialize(nil))
	}
	if r := s.do(http.MethodPost, "", nil, initializeBody); r.status != http.StatusServiceUnavailable {
		t.Fatalf("a session past the cap after the room came back: %d %s", r.status, r.body)
	}
	if live := s.liveSessions(nil, again); len(live) != max {
		t.Fatalf("%d of %d new sessions live", len(live), max)
	}
}
