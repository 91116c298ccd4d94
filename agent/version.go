package agent

import (
	"runtime/debug"
	"sync"
)

// version is the agent's build version, set when it is linked:
//
//	go build -ldflags "-X github.com/sandbox-mcp/sandbox-mcp/agent.version=v1.2.3" ./cmd/sandbox-agent
//
// (make build sets it from `git describe`, as it does the server's).
var version string

// Version identifies this agent build, in its hello frame (the server logs
// it) and for `sandbox-agent version`: the version set at link time, else
// the module version or the VCS revision the Go toolchain recorded in the
// binary, else "dev". It is the build's, never a hand-kept string; the
// protocol's compatibility is agentproto.Version.
func Version() string { return buildVersion() }

var buildVersion = sync.OnceValue(func() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified == "true" {
		rev += "-dirty"
	}
	return rev
})
