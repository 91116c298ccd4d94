package main

import (
	"context"
	"fmt"
	"io"
	"time"
)

// prepareTimeout bounds `sandbox-mcp prepare`: an image build on a loaded
// engine takes minutes.
const prepareTimeout = 15 * time.Minute

// prepareCmd prepares, with the server's flags, what the server would
// prepare in the background at its start (the runtime image, a read-only
// workspace's seed image, the agent's copy for bind mounts), and returns
// when it is done: `make run` runs it first, so that a client started next
// finds sandboxes ready at once. It logs to stderr as the server does.
func prepareCmd(ctx context.Context, args []string, stderr io.Writer, getenv func(string) string) int {
	cfg, err := ParseConfig(args, getenv)
	if err != nil {
		fmt.Fprintf(stderr, "sandbox-mcp prepare: %v\n", err)
		return 2
	}
	log := newLogger(stderr, cfg.LogLevel)
	ctx, cancel := context.WithTimeout(ctx, prepareTimeout)
	defer cancel()
	start := time.Now()
	m, release, err := newManager(ctx, cfg, log, nil, false)
	if err != nil {
		log.Error("sandbox-mcp prepare failed", "err", err)
		return 1
	}
	defer release()
	defer m.Close(context.Background())
	if err := m.WaitPrepared(ctx, 0, 0, nil); err != nil {
		log.Error("sandbox-mcp prepare failed", "err", err)
		return 1
	}
	fmt.Fprintf(stderr, "sandbox-mcp: sandboxes prepared in %s; a server started with the same flags finds them ready\n", time.Since(start).Round(time.Millisecond))
	return 0
}
