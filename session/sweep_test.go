package session

import (
	"context"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// TestSweep leaves what a crashed server would (a stopped sandbox container)
// and what a live server beside this one holds (a running one), and checks
// the sweep removes the first only.
func TestSweep(t *testing.T) {
	m := testManager(t, nil)
	ctx := context.Background()
	img := testenv.TestImage(t)
	mk := func(instance string, start bool, cmd ...string) string {
		t.Helper()
		c, err := testenv.Engine(t).ContainerCreate(ctx, client.ContainerCreateOptions{
			Config: &container.Config{Image: img, Cmd: cmd, Labels: map[string]string{
				docker.LabelManaged: "1", docker.LabelInstance: instance, docker.LabelSandbox: "sb-" + instance,
			}},
			HostConfig: &container.HostConfig{NetworkMode: "none"},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { testenv.RemoveLabelled(testenv.Engine(t), docker.LabelInstance, instance) })
		if start {
			if _, err := testenv.Engine(t).ContainerStart(ctx, c.ID, client.ContainerStartOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		return c.ID
	}
	dead := "dead-" + randomID("")[:8]
	live := "live-" + randomID("")[:8]
	starting := "starting-" + randomID("")[:8]
	exited := mk(dead, true, "true")
	running := mk(live, true, "sleep", "300")
	created := mk(starting, false, "true")
	// Wait for the first to exit.
	for deadline := time.Now().Add(10 * time.Second); ; {
		r, err := testenv.Engine(t).ContainerInspect(ctx, exited, client.ContainerInspectOptions{})
		if isGone(err) {
			break // a server beside this one (another test) swept it first
		}
		if err != nil {
			t.Fatal(err)
		}
		if !r.Container.State.Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("container did not exit")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := m.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Engine(t).ContainerInspect(ctx, exited, client.ContainerInspectOptions{}); !isGone(err) {
		t.Errorf("the stopped leftover was not swept: %v", err)
	}
	for name, id := range map[string]string{"running": running, "freshly created": created} {
		if _, err := testenv.Engine(t).ContainerInspect(ctx, id, client.ContainerInspectOptions{}); err != nil {
			t.Errorf("the sweep removed a live server's %s container: %v", name, err)
		}
	}
}
