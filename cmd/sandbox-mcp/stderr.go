package main

import (
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
)

// errStderrClosed is why a server whose stderr went away stops.
var errStderrClosed = errors.New("the server's stderr was closed (the client went away)")

// logSink is the server's stderr as its logger writes to it. A client may
// close the reading end of the server's stderr before its stdin (mcp-go's
// stdio client does): with SIGPIPE ignored, the next write fails with
// EPIPE instead of killing the server with its sandboxes, networks and
// firewall rules left behind. The first such failure calls lost, which
// shuts the server down the way an EOF on stdin does; later writes are
// dropped. Other write errors (a full disk) drop that write only.
type logSink struct {
	w    io.Writer
	lost func()
	once sync.Once
	gone atomic.Bool
}

func (s *logSink) Write(p []byte) (int, error) {
	if s.gone.Load() {
		return len(p), nil
	}
	if _, err := s.w.Write(p); err != nil && (errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrClosed)) {
		s.gone.Store(true)
		s.once.Do(s.lost)
	}
	return len(p), nil
}
