package docker

import (
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"

	"github.com/moby/moby/api/pkg/stdcopy"
)

// demuxAttach splits a container's attach stream, in which the engine
// multiplexes the agent's stdout and stderr (stdcopy's framing: an 8-byte
// header of stream and length before each chunk), into the agent's frames
// (its stdout, returned as a plain reader for newConn) and its diagnostics
// (its stderr, logged line by line and kept for error messages). The frames
// reader ends with io.EOF when the stream ends cleanly, else with the
// stream's error.
//
// The split happens in the reader's own Read, on the goroutine that reads
// the frames, rather than in a copying goroutine behind a pipe: every frame
// from the agent then reaches the reader without a hand-off between
// goroutines, which is a measurable part of a warm exec's round trip.
func demuxAttach(r io.Reader, log *slog.Logger) (io.Reader, *lineLogger) {
	stderr := &lineLogger{log: log}
	return &demuxReader{r: r, stderr: stderr}, stderr
}

// demuxReader is the stdout half of an attach stream; stderr chunks met on
// the way go to the lineLogger.
type demuxReader struct {
	r      io.Reader
	stderr *lineLogger
	left   int // bytes of the current stdout chunk not read yet
	err    error
	hdr    [8]byte
}

func (d *demuxReader) Read(p []byte) (int, error) {
	for d.left == 0 {
		if d.err != nil {
			return 0, d.err
		}
		if err := d.nextChunk(); err != nil {
			d.err = err
			d.stderr.flush()
			return 0, err
		}
	}
	if len(p) > d.left {
		p = p[:d.left]
	}
	n, err := d.r.Read(p)
	d.left -= n
	if err == io.EOF && d.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	if err != nil && err != io.EOF {
		d.err = err
		d.stderr.flush()
	} else {
		err = nil
	}
	return n, err
}

// nextChunk reads headers until one announces stdout bytes, passing stderr
// chunks to the logger. A clean end between chunks is io.EOF.
func (d *demuxReader) nextChunk() error {
	for {
		if _, err := io.ReadFull(d.r, d.hdr[:]); err != nil {
			if err == io.EOF {
				return io.EOF
			}
			return fmt.Errorf("attach stream: %w", err)
		}
		size := int(binary.BigEndian.Uint32(d.hdr[4:]))
		switch stdcopy.StdType(d.hdr[0]) {
		case stdcopy.Stdin, stdcopy.Stdout:
			d.left = size
			if size > 0 {
				return nil
			}
		case stdcopy.Stderr:
			if _, err := io.CopyN(d.stderr, d.r, int64(size)); err != nil {
				return fmt.Errorf("attach stream: %w", noEOF(err))
			}
		case stdcopy.Systemerr:
			msg := make([]byte, min(size, maxStderrLine))
			if _, err := io.ReadFull(d.r, msg); err != nil {
				return fmt.Errorf("attach stream: %w", noEOF(err))
			}
			return fmt.Errorf("the engine reported an error on the attach stream: %s", msg)
		default:
			return fmt.Errorf("attach stream: unknown stream %d in a chunk header", d.hdr[0])
		}
	}
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
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
