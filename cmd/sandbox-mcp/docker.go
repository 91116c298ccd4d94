package main

import (
	"log/slog"
	"path/filepath"

	"github.com/sandbox-mcp/sandbox-mcp/session"
	"github.com/sandbox-mcp/sandbox-mcp/session/backend/docker"
)

// newDockerBackend builds the Docker backend on cli from the configuration,
// as newKubeBackend builds the Kubernetes one: session links neither. The
// agent's copies for bind mounts go to the state directory; a read-only
// workspace's --workspace-from content reaches it from loadSeed
// (backend.ReadOnlySeed), which reads it once for every backend.
func newDockerBackend(cfg Config, cli docker.Engine, instance string, log *slog.Logger) (*docker.Docker, error) {
	return docker.New(docker.Config{
		Client:         cli,
		Image:          cfg.Image,
		Images:         cfg.templateImages(),
		AgentBinary:    cfg.AgentBin,
		AgentMount:     cfg.AgentMount,
		AgentDir:       filepath.Join(cfg.StateDir, "agents"),
		UID:            session.DefaultUID,
		GID:            session.DefaultUID,
		Instance:       instance,
		Runtime:        cfg.Runtime,
		SeccompProfile: cfg.SeccompProfile,
		Egress:         cfg.anyNetworked(), // the default's network or a template's
		NetworkPool:    cfg.NetworkPool,
		Logger:         log.With("component", "engine"),
	})
}
