package engine

import (
	"io"
	"log/slog"
	"strings"
	"sync"

	"github.com/moby/moby/api/pkg/stdcopy"
)

// demuxAttach splits a container's attach stream, in which the engine
// multiplexes the agent's stdout and stderr, into the agent's frames (its
// stdout, returned as a plain reader for newConn) and its diagnostics (its
// stderr, logged line by line and kept for error messages). The frames
// reader ends with io.EOF when the stream ends cleanly, else with the
// stream's error.
func demuxAttach(r io.Reader, log *slog.Logger) (io.Reader, *lineLogger) {
	pr, pw := io.Pipe()
	stderr := &lineLogger{log: log}
	go func() {
		_, err := stdcopy.StdCopy(pw, stderr, r)
		if err == nil {
			err = io.EOF
		}
		pw.CloseWithError(err)
		stderr.flush()
	}()
	return pr, stderr
}

// lineLogger logs the agent's stderr line by line, bounded, and keeps the
// last lines for error messages.
type lineLogger struct {
	log  *slog.Logger
	mu   sync.Mutex
	buf  []byte
	last []string
}

const (
	maxStderrLine   = 512
	keptStderrLines = 8
)

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range p {
		if b == '\n' || len(l.buf) >= maxStderrLine {
			l.emit()
			if b == '\n' {
				continue
			}
		}
		l.buf = append(l.buf, b)
	}
	return len(p), nil
}

func (l *lineLogger) emit() {
	if len(l.buf) == 0 {
		return
	}
	line := string(l.buf)
	l.buf = l.buf[:0]
	l.log.Debug("agent", "line", line)
	l.last = append(l.last, line)
	if len(l.last) > keptStderrLines {
		l.last = l.last[1:]
	}
}

func (l *lineLogger) flush() {
	l.mu.Lock()
	l.emit()
	l.mu.Unlock()
}

// tail returns the last lines the agent wrote to stderr.
func (l *lineLogger) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.emit()
	if len(l.last) == 0 {
		return "none"
	}
	return strings.Join(l.last, " | ")
}
