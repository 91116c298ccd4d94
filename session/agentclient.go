package session

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// ExecRequest is one command to run in a sandbox.
type ExecRequest struct {
	Argv []string
	// Program is the resolved program (see Sandbox.Resolve); "" lets the
	// agent resolve Argv[0] itself.
	Program string
	Cwd     string   // workspace-relative
	Env     []string // NAME=VALUE, on top of the sandbox's environment
	Stdin   []byte   // nil for no input
	// Timeout kills the command and everything it started.
	Timeout time.Duration
	// MaxOutput is the number of bytes kept per stream.
	MaxOutput int64
	// OnOutput, if set, sees output as it arrives (for progress). It must
	// not block.
	OnOutput func(stream string, p []byte)
}

// ExecResult is what a command did.
type ExecResult struct {
	ExitCode        int
	Signal          string
	Stdout, Stderr  []byte
	StdoutTruncated bool
	StderrTruncated bool
	TimedOut        bool
	Cancelled       bool
	Killed          int
	Duration        time.Duration
}

// Grace periods the server gives the agent beyond a command's own deadline
// before it stops trusting it.
const (
	execGrace   = 5 * time.Second
	cancelGrace = 5 * time.Second
	// opTimeout bounds a file operation.
	opTimeout = 60 * time.Second
	// bulkTimeout bounds a snapshot or restore.
	bulkTimeout = 10 * time.Minute
)

func (c *conn) exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	var res ExecResult
	p, err := c.open(agentproto.KindExec, agentproto.ExecRequest{
		Path: req.Program, Argv: req.Argv, Cwd: req.Cwd, Env: req.Env,
		TimeoutMillis: req.Timeout.Milliseconds(), MaxOutput: req.MaxOutput, Stdin: req.Stdin != nil,
	})
	if err != nil {
		return res, unavailable(err)
	}
	defer c.close(p)
	if req.Stdin != nil {
		if err := c.sendData(p, req.Stdin); err != nil {
			return res, unavailable(err)
		}
	}
	// The agent enforces the timeout; the server's own deadline covers an
	// agent that does not.
	deadline := time.NewTimer(req.Timeout + execGrace)
	defer deadline.Stop()
	var stdout, stderr bytes.Buffer
	cancelled := false
	var cancelTimer <-chan time.Time
	done := ctx.Done()
	for {
		var f agentproto.Frame
		select {
		case f = <-p.frames:
		case <-c.dead:
			return res, unavailable(c.err())
		case <-done:
			// Have the agent kill the command, and wait for it to say so.
			done = nil
			cancelled = true
			c.cancel(p)
			cancelTimer = time.After(cancelGrace)
			continue
		case <-deadline.C:
			c.cancel(p)
			cancelTimer = time.After(cancelGrace)
			continue
		case <-cancelTimer:
			c.fail(fmt.Errorf("the agent did not stop a command it was told to stop"))
			return res, unavailable(c.err())
		}
		switch f.Kind {
		case agentproto.KindStdout, agentproto.KindStderr:
			buf, name := &stdout, "stdout"
			if f.Kind == agentproto.KindStderr {
				buf, name = &stderr, "stderr"
			}
			// The agent sends at most MaxOutput bytes per stream and drops
			// the rest itself.
			if int64(buf.Len()+len(f.Payload)) > req.MaxOutput {
				c.fail(fmt.Errorf("%w: more than the %d bytes of %s asked for", errProtocol, req.MaxOutput, name))
				return res, unavailable(c.err())
			}
			buf.Write(f.Payload)
			if req.OnOutput != nil && len(f.Payload) > 0 {
				req.OnOutput(name, f.Payload)
			}
		case agentproto.KindExit:
			var r agentproto.ExecResult
			if err := f.Decode(&r); err != nil {
				c.fail(fmt.Errorf("%w: %v", errProtocol, err))
				return res, unavailable(c.err())
			}
			res = ExecResult{
				ExitCode:        r.ExitCode,
				Signal:          r.Signal,
				Stdout:          stdout.Bytes(),
				Stderr:          stderr.Bytes(),
				StdoutTruncated: r.StdoutBytes > int64(stdout.Len()),
				StderrTruncated: r.StderrBytes > int64(stderr.Len()),
				TimedOut:        r.TimedOut,
				Cancelled:       r.Cancelled || cancelled,
				Killed:          r.Killed,
				Duration:        max(r.Duration(), 0),
			}
			if len(res.Signal) > 16 {
				res.Signal = res.Signal[:16]
			}
			if cancelled {
				return res, context.Cause(ctx)
			}
			return res, nil
		case agentproto.KindError:
			return res, c.decodeError(f)
		default:
			c.fail(fmt.Errorf("%w: %q frame in answer to exec", errProtocol, f.Kind))
			return res, unavailable(c.err())
		}
	}
}

// ReadResult is part of a file.
type ReadResult struct {
	Data      []byte
	Size      int64
	Truncated bool
}

// readFile reads up to maxBytes of a file (and no more than length, when
// length is not 0). The data frames are copied once, into a buffer that
// starts at one chunk and, for a longer file, grows once to the most the
// read may return; so a small read does not allocate the cap, and a large
// one is not copied again and again as a doubling buffer would be.
func (c *conn) readFile(ctx context.Context, path string, offset, length, maxBytes int64) (ReadResult, error) {
	var res ReadResult
	limit := maxBytes
	if length > 0 && length < limit {
		limit = length
	}
	buf := make([]byte, 0, min(limit, agentproto.ChunkSize))
	err := c.roundTrip(ctx, opTimeout, agentproto.KindRead,
		agentproto.ReadRequest{Path: path, Offset: offset, Length: length, Max: maxBytes}, nil,
		func(p []byte) error {
			if int64(len(buf)+len(p)) > limit {
				return fmt.Errorf("%w: read returned more than the %d bytes asked for", errProtocol, limit)
			}
			if len(buf)+len(p) > cap(buf) {
				grown := make([]byte, len(buf), limit)
				copy(grown, buf)
				buf = grown
			}
			buf = append(buf, p...)
			return nil
		},
		func(f agentproto.Frame) error {
			var r agentproto.ReadResult
			if err := f.Decode(&r); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			res = ReadResult{Data: buf, Size: max(r.Size, 0), Truncated: r.Truncated}
			return nil
		})
	return res, err
}

// WriteResult is what a write did.
type WriteResult struct {
	Written int64
	Size    int64
}

// writeFile writes exactly size bytes read from r. The content goes to the
// agent a chunk at a time, so the server never holds a second copy of it.
// If r fails or ends early, the agent is sent less than size bytes, which
// leaves the file as it was, and r's error is returned.
func (c *conn) writeFile(ctx context.Context, path string, r io.Reader, size int64, appendTo bool, mode uint32) (WriteResult, error) {
	var res WriteResult
	var inErr error
	err := c.roundTrip(ctx, opTimeout, agentproto.KindWrite,
		agentproto.WriteRequest{Path: path, Append: appendTo, Mode: mode, Size: size},
		func(p *pending) error {
			inErr = c.sendFrom(p, r, size)
			return inErr
		},
		nil,
		func(f agentproto.Frame) error {
			var r agentproto.WriteResult
			if err := f.Decode(&r); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			res = WriteResult{Written: r.Written, Size: r.Size}
			return nil
		})
	// roundTrip waited for the input to be sent, so inErr is set.
	var local errLocal
	if errors.As(inErr, &local) {
		return res, local.err
	}
	return res, err
}

// sendFrom sends exactly size bytes of r as data frames, then eof. A read
// error or an early end of r is an errLocal; eof is still sent, so the agent
// sees a short input and leaves the file alone.
func (c *conn) sendFrom(p *pending, r io.Reader, size int64) error {
	buf := make([]byte, min(size, agentproto.ChunkSize))
	var sent int64
	for sent < size {
		n, err := io.ReadFull(r, buf[:min(int64(len(buf)), size-sent)])
		if n > 0 {
			if err := c.send(p.id, agentproto.KindData, nil, buf[:n]); err != nil {
				return err
			}
			sent += int64(n)
		}
		if err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				err = fmt.Errorf("the content ended after %d of %d bytes", sent, size)
			}
			if serr := c.send(p.id, agentproto.KindEOF, nil, nil); serr != nil {
				return serr
			}
			return errLocal{err}
		}
	}
	return c.send(p.id, agentproto.KindEOF, nil, nil)
}

// Entry is one listed file.
type Entry = agentproto.Entry

// errListFull stops a list whose stream passed its byte cap.
var errListFull = errors.New("the list passed its byte cap")

// list lists a directory, at most maxEntries entries and
// policy.ListBytes(maxEntries) bytes of the agent's stream: a list past
// either is cut short and reported truncated.
func (c *conn) list(ctx context.Context, path string, recursive bool, maxEntries int) ([]Entry, bool, error) {
	var entries []Entry
	var truncated bool
	var got int64
	maxBytes := policy.ListBytes(maxEntries)
	err := c.roundTrip(ctx, opTimeout, agentproto.KindList,
		agentproto.ListRequest{Path: path, Recursive: recursive, Max: maxEntries}, nil,
		func(p []byte) error {
			// One JSON line per entry, each in one frame.
			for len(p) > 0 {
				line, rest, _ := bytes.Cut(p, []byte{'\n'})
				if got += int64(len(line)) + 1; got > maxBytes {
					return errLocal{errListFull}
				}
				var e Entry
				if err := json.Unmarshal(line, &e); err != nil {
					return fmt.Errorf("%w: list entry: %v", errProtocol, err)
				}
				if len(entries) >= maxEntries || !validEntry(e) {
					return fmt.Errorf("%w: list entry out of bounds", errProtocol)
				}
				entries = append(entries, e)
				p = rest
			}
			return nil
		},
		func(f agentproto.Frame) error {
			var r agentproto.ListResult
			if err := f.Decode(&r); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			truncated = r.Truncated
			return nil
		})
	if errors.Is(err, errListFull) {
		return entries, true, nil
	}
	return entries, truncated, err
}

func validEntry(e Entry) bool {
	switch e.Type {
	case agentproto.TypeFile, agentproto.TypeDir, agentproto.TypeSymlink, agentproto.TypeOther:
	default:
		return false
	}
	return e.Path != "" && len(e.Path) <= 2*policy.MaxPathBytes && len(e.Target) <= 2*policy.MaxPathBytes &&
		utf8.ValidString(e.Path) && utf8.ValidString(e.Target) && e.Size >= 0
}

func (c *conn) resolve(ctx context.Context, names []string, cwd string) ([]string, error) {
	var out []string
	err := c.roundTrip(ctx, opTimeout, agentproto.KindResolve, agentproto.ResolveRequest{Names: names, Cwd: cwd}, nil, nil,
		func(f agentproto.Frame) error {
			var r agentproto.ResolveResult
			if err := f.Decode(&r); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			if len(r.Paths) != len(names) {
				return fmt.Errorf("%w: resolve answered %d paths for %d names", errProtocol, len(r.Paths), len(names))
			}
			out = r.Paths
			return nil
		})
	return out, err
}

// snapshot streams a tar of the workspace into w, never more than
// lim.MaxBytes bytes.
func (c *conn) snapshot(ctx context.Context, w io.Writer, lim agentproto.Limits) (agentproto.SnapshotResult, error) {
	var res agentproto.SnapshotResult
	var n int64
	err := c.roundTrip(ctx, bulkTimeout, agentproto.KindSnapshot, agentproto.SnapshotRequest{Limits: lim}, nil,
		func(p []byte) error {
			n += int64(len(p))
			if lim.MaxBytes > 0 && n > lim.MaxBytes {
				return fmt.Errorf("%w: snapshot stream exceeds %d bytes", errProtocol, lim.MaxBytes)
			}
			if _, err := w.Write(p); err != nil {
				return errLocal{err}
			}
			return nil
		},
		func(f agentproto.Frame) error {
			if err := f.Decode(&res); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			return nil
		})
	return res, err
}

// restore replaces the workspace with the tar stream in data.
func (c *conn) restore(ctx context.Context, data io.Reader, lim agentproto.Limits) (agentproto.RestoreResult, error) {
	var res agentproto.RestoreResult
	err := c.roundTrip(ctx, bulkTimeout, agentproto.KindRestore, agentproto.RestoreRequest{Limits: lim},
		func(p *pending) error {
			buf := make([]byte, agentproto.ChunkSize)
			for {
				n, err := data.Read(buf)
				if n > 0 {
					if err := c.send(p.id, agentproto.KindData, nil, buf[:n]); err != nil {
						return err
					}
				}
				if err == io.EOF {
					return c.send(p.id, agentproto.KindEOF, nil, nil)
				}
				if err != nil {
					return errLocal{err}
				}
			}
		}, nil,
		func(f agentproto.Frame) error {
			if err := f.Decode(&res); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			return nil
		})
	return res, err
}

// errLocal wraps a failure on the server's side of a transfer (a disk
// error, say), which says nothing about the agent.
type errLocal struct{ err error }

func (e errLocal) Error() string { return e.err.Error() }
func (e errLocal) Unwrap() error { return e.err }

// roundTrip runs one request that is not exec: send it (and its input, via
// sendInput), pass data payloads to onData, and decode the result frame with
// onResult. A protocol violation ends the connection. When ctx ends or the
// timeout passes, the agent is told to cancel.
func (c *conn) roundTrip(ctx context.Context, timeout time.Duration, kind agentproto.Kind, body any,
	sendInput func(*pending) error, onData func([]byte) error, onResult func(agentproto.Frame) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	p, err := c.open(kind, body)
	if err != nil {
		return unavailable(err)
	}
	defer c.close(p)
	if sendInput != nil {
		inErr := make(chan error, 1)
		go func() { inErr <- sendInput(p) }()
		defer func() {
			if err := <-inErr; err != nil && !errors.As(err, new(errLocal)) {
				c.log.Debug("session: sending request input", "err", err)
			}
		}()
	}
	for {
		f, err := c.next(ctx, p)
		if err != nil {
			if ctx.Err() != nil {
				c.cancel(p)
				if errors.Is(ctx.Err(), context.DeadlineExceeded) && context.Cause(ctx) == ctx.Err() {
					return errcode.Errorf(errcode.Timeout, "the sandbox did not finish the %s within %s; try again, or with less data", kind, timeout)
				}
				return context.Cause(ctx)
			}
			return unavailable(err)
		}
		switch f.Kind {
		case agentproto.KindData:
			if onData == nil {
				err = fmt.Errorf("%w: data frame in answer to %s", errProtocol, kind)
			} else {
				err = onData(f.Payload)
			}
		case agentproto.KindResult:
			if err := onResult(f); err != nil {
				c.fail(err)
				return unavailable(c.err())
			}
			return nil
		case agentproto.KindError:
			return c.decodeError(f)
		default:
			err = fmt.Errorf("%w: %q frame in answer to %s", errProtocol, f.Kind, kind)
		}
		if err != nil {
			var local errLocal
			if errors.As(err, &local) {
				c.cancel(p)
				return local.err
			}
			c.fail(err)
			return unavailable(c.err())
		}
	}
}

func (c *conn) decodeError(f agentproto.Frame) error {
	var e agentproto.Error
	if err := f.Decode(&e); err != nil {
		c.fail(fmt.Errorf("%w: %v", errProtocol, err))
		return unavailable(c.err())
	}
	return fromAgent(e)
}

// unavailable reports a sandbox that stopped answering. Errors that say
// nothing about the agent (a refusal, a request that was never sent) pass
// through.
func unavailable(err error) error {
	if _, ok := errcode.As(err); ok || errors.As(err, new(errLocal)) {
		return err
	}
	return errcode.Errorf(errcode.Unavailable,
		"the sandbox stopped (%v); its workspace is lost. Call again: the next call starts a fresh sandbox", err)
}
