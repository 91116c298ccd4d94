package docker

import (
	"context"
	"testing"

	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/internal/testenv"
	"github.com/sandbox-mcp/sandbox-mcp/netproxy"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/backendtest"
)

// TestBackendConformance runs backend's conformance suite
// (session/backend/backendtest) on the Docker backend and the real engine,
// with the test image and the agent built for this run. Each backend is an
// instance of its own, so what it leaves is found by its label.
func TestBackendConformance(t *testing.T) {
	cli := testenv.Engine(t)
	img := testenv.TestImage(t)
	bins, err := testenv.Build(t.TempDir(), false, false)
	if err != nil {
		t.Fatal(err)
	}
	backendtest.Run(t, backendtest.Harness{
		New: func(t *testing.T) backend.Backend {
			instance := "test-conf-" + randomID()
			t.Cleanup(func() {
				testenv.RemoveLabelled(cli, LabelInstance, instance)
				for _, left := range leftovers(t, cli, instance) {
					t.Errorf("left at the end of the test: %s", left)
				}
			})
			d, err := New(Config{Client: cli, Image: img, AgentBinary: bins.Agent, Instance: instance, UID: 1000, GID: 1000})
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Prepare(context.Background(), func(backend.Step) {}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.RemoveLeftovers(context.Background()) })
			return d
		},
		Spec: backend.InstanceSpec{UID: 1000, GID: 1000, Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
			Limits: backend.Limits{Memory: 64 << 20, NanoCPUs: 5e8, Pids: 64, NoFile: 256, WorkspaceBytes: 1 << 20, TmpBytes: 1 << 20}},
		RemoveFromOutside: func(t *testing.T, _ backend.Backend, inst backend.Instance) {
			if _, err := cli.ContainerRemove(context.Background(), inst.Name(), client.ContainerRemoveOptions{Force: true}); err != nil {
				t.Fatalf("docker rm -f %s: %v", inst.Name(), err)
			}
		},
		Leftovers: func(t *testing.T, b backend.Backend) []string {
			return leftovers(t, cli, b.(*Docker).Instance())
		},
		Proxy: func(t *testing.T) *netproxy.Proxy {
			p, err := netproxy.New(netproxy.Config{})
			if err != nil {
				t.Fatal(err)
			}
			return p
		},
		// The engine refuses a memory limit under 6 MB when it creates the
		// container: after the network, if any, was made.
		BreakSpec: func(spec *backend.InstanceSpec) { spec.Limits.Memory = 1 << 20 },
	})
}
