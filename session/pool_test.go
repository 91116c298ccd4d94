package session

import (
	"context"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

func waitWarm(t *testing.T, m *Manager, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for m.WarmReady() != n {
		if time.Now().After(deadline) {
			t.Fatalf("warm pool holds %d, want %d", m.WarmReady(), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestWarmPool(t *testing.T) {
	dir := seedDir(t)
	m := testManager(t, func(o *Options) { o.Warm = 2; seedFrom(t, o, dir) })
	waitWarm(t, m, 2)
	ready := testenv.Containers(t, testenv.Engine(t), docker.LabelInstance, m.Instance())
	if len(ready) != 2 {
		t.Fatalf("containers: %v", ready)
	}
	// A warm container is a sandbox container like any other.
	m.pool.mu.Lock()
	w := m.pool.ready[0]
	m.pool.mu.Unlock()
	checkHardened(t, m, w.inst.box.Name(), w.id)

	// A new session takes one: its container is running before its first
	// call, and seeded.
	sb, err := m.Sandbox("a", "")
	if err != nil {
		t.Fatal(err)
	}
	if sb.ContainerID() == "" {
		t.Fatal("the new sandbox did not take a warm container")
	}
	if got := string(run(t, sb, "cat", "README").Stdout); got != "seeded\n" {
		t.Fatalf("warm container not seeded: %q", got)
	}
	// The pool refills.
	waitWarm(t, m, 2)
	if n := len(testenv.Containers(t, testenv.Engine(t), docker.LabelInstance, m.Instance())); n != 3 {
		t.Fatalf("%d containers, want 1 sandbox + 2 warm", n)
	}
	// A warm container that died while waiting is not handed out.
	m.pool.mu.Lock()
	dead := m.pool.ready[0]
	m.pool.mu.Unlock()
	if _, err := testenv.Engine(t).ContainerRemove(context.Background(), dead.inst.box.Name(), client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, testenv.Engine(t), dead.inst.box.Name())
	sb2, _ := m.Sandbox("b", "")
	if sb2.ID() == dead.id {
		t.Fatal("took a dead warm container")
	}
	run(t, sb2, "true")
	// Close leaves nothing: testManager's cleanup checks.
}

func TestWarmPoolRespectsMaxSessions(t *testing.T) {
	m := testManager(t, func(o *Options) { o.Warm = 5; o.MaxSandboxes = 3 })
	waitWarm(t, m, 3)
	for _, k := range []string{"a", "b"} {
		sb, err := m.Sandbox(k, "")
		if err != nil {
			t.Fatal(err)
		}
		run(t, sb, "true")
	}
	waitWarm(t, m, 1)
	// The pool grows only while poolNeeds says so: with 2 sandboxes and 1
	// warm container of at most 3, it must not.
	if m.poolNeeds() {
		t.Fatalf("the pool would grow beyond --max-sandboxes: warm %d with 2 sandboxes of at most 3", m.WarmReady())
	}
	if n := len(testenv.Containers(t, testenv.Engine(t), docker.LabelInstance, m.Instance())); n != 3 {
		t.Fatalf("%d containers, want 3 (--max-sandboxes)", n)
	}
	m.Release("a")
	waitWarm(t, m, 2)
}
