// Command sandbox-agent runs inside every sandbox container as its main
// process and serves the sandbox-mcp server over stdin and stdout (see
// package agentproto). It is not meant to be run by hand.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/sandbox-mcp/sandbox-mcp/session/agent"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println(agent.BuildVersion)
		return
	}
	if len(os.Args) > 1 && os.Args[1] == ProbeIOURing {
		probeIOURing(os.Stdout)
		return
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	workspace := os.Getenv("SANDBOX_MCP_WORKSPACE")
	if workspace == "" {
		workspace = "/workspace"
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := agent.Serve(ctx, os.Stdin, os.Stdout, agent.Options{
		Workspace: workspace,
		Env:       os.Environ(),
		Path:      filepath.SplitList(os.Getenv("PATH")),
		Logger:    log,
	})
	if err != nil {
		log.Error("agent stopped", "err", err)
		os.Exit(1)
	}
}
