package session

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// TestAgentMount: on this (local) engine the agent is bind-mounted by
// default, read-only, with nothing built (the base image runs as it is);
// --agent-mount=image builds the layered image instead; both run commands.
func TestAgentMount(t *testing.T) {
	for _, how := range []string{docker.AgentMountAuto, docker.AgentMountImage} {
		t.Run(how, func(t *testing.T) {
			m := testDockerManager(t, nil, func(c *docker.Config) { c.AgentMount = how })
			if err := m.WaitPrepared(context.Background(), 3*time.Minute, 0, nil); err != nil {
				t.Fatal(err)
			}
			img, mounted := m.RuntimeImage(), m.AgentMountPath()
			if how == docker.AgentMountAuto {
				if !strings.HasPrefix(img, "sha256:") || !strings.HasPrefix(mounted, m.opts.StateDir) {
					t.Fatalf("runtime image %q, agent mount %q: want the base image as it is and the agent from the state dir", img, mounted)
				}
			} else if !strings.HasPrefix(img, docker.RuntimeImageRepo+":") || mounted != "" {
				t.Fatalf("runtime image %q, agent mount %q: want a layered image", img, mounted)
			}
			sb := newSandbox(t, m)
			res := sh(t, sb, "grep ' /.sandbox-mcp/agent ' /proc/self/mountinfo; echo x >> /.sandbox-mcp/agent && echo WROTE")
			out := string(res.Stdout)
			if strings.Contains(out, "WROTE") {
				t.Fatalf("the sandbox changed the agent: %s %s", out, res.Stderr)
			}
			if bound := strings.Contains(out, "/.sandbox-mcp/agent ro,"); bound != (how == docker.AgentMountAuto) {
				t.Fatalf("agent mount in the container: %q (want a read-only bind mount: %v)", out, how == docker.AgentMountAuto)
			}
		})
	}
}
