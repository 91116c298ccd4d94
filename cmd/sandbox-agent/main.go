// Command sandbox-agent runs inside every sandbox container as its main
// process and serves the sandbox-mcp server over stdin and stdout (see
// package agentproto). It is not meant to be run by hand.
//
// It starts as root with CAP_SETUID and CAP_SETGID only, and before it reads
// a frame it drops to the sandbox user named by -user for everything but
// starting commands (see agent.DropPrivileges).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/sandbox-mcp/sandbox-mcp/agent"
	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Printf("sandbox-agent %s (protocol %d)\n", agent.Version(), agentproto.Version)
		return
	}
	if len(os.Args) > 1 && os.Args[1] == ProbeIOURing {
		probeIOURing(os.Stdout)
		return
	}
	if len(os.Args) == 3 && os.Args[1] == ProbePids {
		n, err := strconv.Atoi(os.Args[2])
		if err != nil || n < 1 {
			fmt.Fprintln(os.Stderr, "sandbox-agent probe-pids: want a thread count")
			os.Exit(2)
		}
		probePids(os.Stdout, n)
		return
	}
	if len(os.Args) == 3 && os.Args[1] == InstallCommand {
		if err := install(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "sandbox-agent install:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == HubCommand {
		os.Exit(hub(os.Args[2:]))
	}
	if len(os.Args) == 2 && os.Args[1] == AttachCommand {
		os.Exit(attach())
	}
	if len(os.Args) > 1 && os.Args[1] == HoldCommand {
		hold()
		return
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("component", "agent")
	fs := flag.NewFlagSet("sandbox-agent", flag.ContinueOnError)
	userFlag := fs.String("user", "", "UID:GID of the sandbox user every command runs as (required)")
	unprivileged := fs.Bool("unprivileged", false, "run as the sandbox user with no capability (a pod under Pod Security restricted): commands run as the agent's own user")
	endInit := fs.Bool("stop-init", false, "when the agent ends, signal the container's pid 1 (sandbox-agent hold) to end too")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *endInit {
		defer stopInit()
	}
	user, err := agent.ParseUser(*userFlag)
	if err != nil {
		log.Error("bad -user", "err", err)
		os.Exit(2)
	}
	if !*unprivileged {
		if err := agent.DropPrivileges(user); err != nil {
			log.Error("cannot take the sandbox user's identity", "err", err)
			os.Exit(1)
		}
	}
	workspace := os.Getenv("SANDBOX_MCP_WORKSPACE")
	if workspace == "" {
		workspace = agentproto.Workspace
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err = agent.Serve(ctx, os.Stdin, os.Stdout, agent.Options{
		Workspace:    workspace,
		Env:          os.Environ(),
		Path:         filepath.SplitList(os.Getenv("PATH")),
		User:         user,
		Unprivileged: *unprivileged,
		Logger:       log,
	})
	if err != nil {
		log.Error("agent stopped", "err", err)
		if *endInit {
			stopInit()
		}
		os.Exit(1)
	}
}
