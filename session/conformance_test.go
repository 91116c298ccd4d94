package session

import (
	"testing"

	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/backendtest"
)

// TestFakeBackendConformance: the in-process fake the state-machine tests
// run on keeps backend's contract (session/backend/backendtest), so what
// those tests prove holds on the real backends too. It runs under -short.
// The proxy checks are skipped: the fake runs no network, and its agent,
// in this process, has no environment of its own.
func TestFakeBackendConformance(t *testing.T) {
	backendtest.Run(t, backendtest.Harness{
		New: func(t *testing.T) backend.Backend { return newFakeBackend(t) },
		Spec: backend.InstanceSpec{UID: 1000, GID: 1000, Env: []string{"PATH=/usr/bin:/bin"},
			Limits: backend.Limits{Memory: 64 << 20, NanoCPUs: 1e9, Pids: 64, NoFile: 256, WorkspaceBytes: 1 << 20, TmpBytes: 1 << 20}},
		RemoveFromOutside: func(t *testing.T, _ backend.Backend, inst backend.Instance) { inst.(*fakeInstance).die() },
		Leftovers: func(t *testing.T, b backend.Backend) []string {
			var left []string
			for _, fi := range b.(*fakeBackend).starts() {
				if !fi.isRemoved() {
					left = append(left, fi.name)
				}
			}
			return left
		},
	})
}
