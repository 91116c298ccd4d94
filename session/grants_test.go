package session

import (
	"testing"
	"time"
)

// A caller's grant lasts an hour by the grants' clock, is the caller's
// only, and is bounded per caller.
func TestCallerGrantsExpire(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	g := &callerGrants{now: func() time.Time { return now }}
	until, err := g.add("alice", "pypi.org", 443)
	if err != nil || !until.Equal(now.Add(time.Hour)) {
		t.Fatalf("add: %v %v", until, err)
	}
	if _, ok := g.until("alice", "pypi.org", 443); !ok {
		t.Fatal("a fresh grant is not live")
	}
	for _, miss := range []struct {
		owner, host string
		port        int
	}{{"bob", "pypi.org", 443}, {"alice", "pypi.org", 80}, {"alice", "files.pypi.org", 443}} {
		if _, ok := g.until(miss.owner, miss.host, miss.port); ok {
			t.Errorf("%+v granted", miss)
		}
	}
	now = now.Add(59 * time.Minute)
	if _, ok := g.until("alice", "pypi.org", 443); !ok || len(g.live("alice")) != 1 {
		t.Fatal("expired before the hour")
	}
	now = now.Add(time.Minute)
	if _, ok := g.until("alice", "pypi.org", 443); ok || len(g.live("alice")) != 0 {
		t.Fatal("still live after the hour")
	}
	for i := range maxCallerGrants {
		if _, err := g.add("alice", "h"+string(rune('a'+i%26))+string(rune('a'+i/26))+".example", 443); err != nil {
			t.Fatalf("grant %d: %v", i, err)
		}
	}
	if _, err := g.add("alice", "one-more.example", 443); err == nil {
		t.Fatal("no bound per caller")
	}
	now = now.Add(time.Hour)
	if _, err := g.add("alice", "one-more.example", 443); err != nil {
		t.Fatalf("expired grants still count: %v", err)
	}
}
