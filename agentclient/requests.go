package agentclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
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
	// Timeout kills the command and everything it started. 0 means none
	// (for a background job: it runs until it ends or is signalled).
	Timeout time.Duration
	// MaxOutput is the output the result carries, both streams together:
	// a longer stream keeps its head and tail (see policy.OutputShares and
	// policy.HeadTail), and the rest stays readable through its job.
	MaxOutput int64
	// Background returns as soon as the command started; its output is
	// read with Sandbox.Job.
	Background bool
	// Label is how the job is listed (the command as the model wrote it).
	Label string
	// OnOutput, if set, sees output as it arrives (for progress). It must
	// not block.
	OnOutput func(stream string, p []byte)
	// OnStart, if set, learns the job id before the command is sent (for
	// progress past what the live output carries). It must not block.
	OnStart func(job string)
	// MaxWait, if set, bounds the wait for a foreground command: past it
	// the call returns with Running set and the output so far, and the
	// command runs on as its job (its Timeout still applies).
	MaxWait time.Duration
}

// ExecResult is what a command did. Stdout and Stderr hold a stream whole,
// or, when it was longer than its share of MaxOutput, its head; the tail
// then follows the Omitted bytes left out.
type ExecResult struct {
	// Job is the command's job id, for Sandbox.Job.
	Job string
	// Running is true for a background job (nothing else is set), and for
	// a foreground command still running at MaxWait (the output so far is
	// set, and the exit fields are not).
	Running         bool
	ExitCode        int
	Signal          string
	Stdout, Stderr  []byte
	StdoutTail      []byte
	StderrTail      []byte
	StdoutOmitted   int64 // bytes left out between Stdout and StdoutTail
	StderrOmitted   int64
	StdoutBytes     int64 // everything the stream carried
	StderrBytes     int64
	StdoutTruncated bool // something was left out
	StderrTruncated bool
	// StdoutDropped and StderrDropped count the oldest bytes of each
	// stream its job no longer keeps: sandbox_job reads from there on.
	StdoutDropped int64
	StderrDropped int64
	TimedOut      bool
	Cancelled     bool
	Killed        int
	Duration      time.Duration
	// PipesHeld: the command ended, but a process still held its stdout or
	// stderr when the agent stopped waiting; the output is what was read
	// by then (the job keeps what comes later).
	PipesHeld bool
	// OOMKills counts the processes the kernel killed for memory in the
	// sandbox while the command ran.
	OOMKills int64
	// NetworkRefused lists what the egress proxy refused this sandbox
	// while the command ran (the latest kinds, at most
	// netproxy.MaxRecentRefusals); nil without a proxy.
	NetworkRefused []NetworkRefusal
}

// NetworkRefusal is one kind of request the egress proxy refused a sandbox.
type NetworkRefusal struct {
	Host   string
	Port   int
	Reason string // the proxy's sentence, as the client got it
	// Unlisted: the host is on none of the sandbox's lists, and it did not
	// drop it; approving it (Sandbox.ApproveHost) would lift the refusal.
	Unlisted bool
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

// JobOpts are an exec's job id and what a sandbox's policy says of jobs.
type JobOpts struct {
	ID         uint64 // 0: run without a job
	KeepOutput int64  // bytes per stream the agent keeps
	MaxJobs    int
}

// Exec runs a command as job jo and waits for it as req says: until it
// ends, starts in the background, or runs past MaxWait.
func (c *Conn) Exec(ctx context.Context, req ExecRequest, jo JobOpts) (ExecResult, error) {
	var res ExecResult
	c.noteJob(jo.ID)
	// The exec's own timeout (TimeoutMillis) bounds it at the agent, which
	// kills the command with everything it started; the request carries
	// no other deadline (a background job outlives its request).
	p, err := c.open(context.WithoutCancel(ctx), agentproto.KindExec, agentproto.ExecRequest{
		Path: req.Program, Argv: req.Argv, Cwd: req.Cwd, Env: req.Env,
		TimeoutMillis: req.Timeout.Milliseconds(), MaxOutput: req.MaxOutput, Stdin: req.Stdin != nil,
		Job: jo.ID, Label: req.Label, Background: req.Background, KeepOutput: jo.KeepOutput, MaxJobs: jo.MaxJobs,
	})
	if err != nil {
		return res, unavailable(err)
	}
	defer c.close(p)
	if jo.ID != 0 {
		res.Job = strconv.FormatUint(jo.ID, 10)
	}
	if req.Stdin != nil {
		if err := c.sendData(p, req.Stdin); err != nil {
			return res, unavailable(err)
		}
	}
	// The agent enforces the timeout; the server's own deadline covers an
	// agent that does not.
	deadline := time.NewTimer(req.Timeout + execGrace)
	defer deadline.Stop()
	if req.Timeout == 0 {
		deadline.Stop()
	}
	// Past MaxWait the agent is told to detach the command, which then
	// runs on as its job.
	var detachC <-chan time.Time
	if req.MaxWait > 0 && jo.ID != 0 && !req.Background {
		t := time.NewTimer(req.MaxWait)
		defer t.Stop()
		detachC = t.C
	}
	var stdout, stderr bytes.Buffer
	cancelled, detached := false, false
	var cancelTimer <-chan time.Time
	done := ctx.Done()
	for {
		var f agentproto.Frame
		select {
		case f = <-p.frames:
		case <-c.dead:
			return res, unavailable(c.Err())
		case <-detachC:
			detachC = nil
			if !cancelled && cancelTimer == nil {
				detached = true
				_ = c.send(p.id, agentproto.KindDetach, nil, nil) // a dead conn shows next
			}
			continue
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
			c.Fail(fmt.Errorf("the agent did not stop a command it was told to stop"))
			return res, unavailable(c.Err())
		}
		switch f.Kind {
		case agentproto.KindStdout, agentproto.KindStderr:
			buf, name := &stdout, "stdout"
			if f.Kind == agentproto.KindStderr {
				buf, name = &stderr, "stderr"
			}
			// The agent sends at most MaxOutput bytes per stream and keeps
			// the rest itself; a background job sends none.
			if int64(buf.Len()+len(f.Payload)) > req.MaxOutput || req.Background {
				c.Fail(fmt.Errorf("%w: more than the %d bytes of %s asked for", errProtocol, req.MaxOutput, name))
				return res, unavailable(c.Err())
			}
			buf.Write(f.Payload)
			if req.OnOutput != nil && len(f.Payload) > 0 {
				req.OnOutput(name, f.Payload)
			}
		case agentproto.KindResult:
			// A background job started, or a detached command runs on.
			var st agentproto.JobStatus
			if err := f.Decode(&st); err != nil || !(req.Background || detached) || !validStatus(st, jo.ID) ||
				st.StdoutBytes < int64(stdout.Len()) || st.StderrBytes < int64(stderr.Len()) {
				c.Fail(fmt.Errorf("%w: a %q frame in answer to exec that is not a background or detached job's status", errProtocol, f.Kind))
				return res, unavailable(c.Err())
			}
			res.Running = st.State == agentproto.JobRunning
			res.ExitCode = st.ExitCode
			if !detached {
				return res, nil
			}
			c.close(p)
			if cancelled {
				// The call was cancelled after the detach: its command
				// goes with it, as a cancelled call's does.
				_, _ = c.Job(context.WithoutCancel(ctx), agentproto.JobRequest{Job: jo.ID, Signal: "KILL"})
				return res, context.Cause(ctx)
			}
			// The result has the output streamed until the detach, cut
			// to the cap like a finished command's.
			res.StdoutBytes, res.StderrBytes = int64(stdout.Len()), int64(stderr.Len())
			res.StdoutDropped, res.StderrDropped = st.StdoutDropped, st.StderrDropped
			err := c.fit(ctx, &res, 0, req.MaxOutput, stdout.Bytes(), stderr.Bytes())
			return res, err
		case agentproto.KindExit:
			var r agentproto.ExecResult
			if err := f.Decode(&r); err != nil || req.Background {
				c.Fail(fmt.Errorf("%w: exit frame: %v", errProtocol, err))
				return res, unavailable(c.Err())
			}
			if r.StdoutBytes < int64(stdout.Len()) || r.StderrBytes < int64(stderr.Len()) {
				c.Fail(fmt.Errorf("%w: the exit frame counts less output than was sent", errProtocol))
				return res, unavailable(c.Err())
			}
			res.ExitCode, res.Signal = r.ExitCode, r.Signal
			res.TimedOut, res.Cancelled = r.TimedOut, r.Cancelled || cancelled
			res.Killed, res.Duration = r.Killed, max(r.Duration(), 0)
			res.StdoutBytes, res.StderrBytes = r.StdoutBytes, r.StderrBytes
			res.PipesHeld, res.OOMKills = r.PipesHeld, max(r.OOMKills, 0)
			// The job keeps the last keepOutput bytes of each stream.
			res.StdoutDropped = max(r.StdoutBytes-jo.KeepOutput, 0)
			res.StderrDropped = max(r.StderrBytes-jo.KeepOutput, 0)
			if len(res.Signal) > 16 {
				res.Signal = res.Signal[:16]
			}
			if cancelled {
				return res, context.Cause(ctx)
			}
			c.close(p)
			if err := c.fit(ctx, &res, jo.ID, req.MaxOutput, stdout.Bytes(), stderr.Bytes()); err != nil {
				return res, err
			}
			return res, nil
		case agentproto.KindError:
			return res, c.decodeError(f)
		default:
			c.Fail(fmt.Errorf("%w: %q frame in answer to exec", errProtocol, f.Kind))
			return res, unavailable(c.Err())
		}
	}
}

// fit cuts a foreground exec's output to the result's cap: each stream
// longer than its share keeps its head (from the live output) and its tail
// (from the live output, or read back from the job).
func (c *Conn) fit(ctx context.Context, res *ExecResult, job uint64, limit int64, live0, live1 []byte) error {
	shares := [2]int64{}
	shares[0], shares[1] = policy.OutputShares(limit, res.StdoutBytes, res.StderrBytes)
	totals := [2]int64{res.StdoutBytes, res.StderrBytes}
	live := [2][]byte{live0, live1}
	var heads, tails [2][]byte
	var omitted [2]int64
	for i := range live {
		if totals[i] <= shares[i] {
			heads[i] = live[i]
			continue
		}
		h, tl := policy.HeadTail(shares[i])
		heads[i] = trimRuneEnd(live[i][:min(h, int64(len(live[i])))])
		from := totals[i] - tl
		switch {
		case totals[i] <= int64(len(live[i])):
			tails[i] = live[i][from:totals[i]]
		case job != 0:
			off := [2]int64{1 << 62, 1 << 62}
			off[i] = from
			jr, err := c.Job(ctx, agentproto.JobRequest{Job: job, StdoutOffset: off[0], StderrOffset: off[1], Max: tl})
			if err != nil {
				return err
			}
			tails[i] = jr.Out[i]
			from = jr.From[i]
		}
		skip := leadingContinuation(tails[i])
		tails[i] = tails[i][skip:]
		from += int64(skip)
		omitted[i] = max(from-int64(len(heads[i])), 0)
		if len(tails[i]) == 0 {
			omitted[i] = totals[i] - int64(len(heads[i]))
		}
	}
	res.Stdout, res.Stderr = heads[0], heads[1]
	res.StdoutTail, res.StderrTail = tails[0], tails[1]
	res.StdoutOmitted, res.StderrOmitted = omitted[0], omitted[1]
	res.StdoutTruncated = res.StdoutOmitted > 0
	res.StderrTruncated = res.StderrOmitted > 0
	return nil
}

// trimRuneEnd drops a UTF-8 sequence cut short at the end of b.
func trimRuneEnd(b []byte) []byte {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			break
		}
	}
	return b
}

// leadingContinuation counts the bytes at the start of b that continue a
// UTF-8 sequence begun before it (at most three).
func leadingContinuation(b []byte) int {
	n := 0
	for n < len(b) && n < utf8.UTFMax-1 && !utf8.RuneStart(b[n]) {
		n++
	}
	return n
}

// ReadResult is part of a file.
type ReadResult struct {
	Data      []byte
	Size      int64
	Truncated bool
	// Offset is the byte of the file Data starts at, End the byte after
	// its last (Data is not one run of the file's bytes when lines were
	// cut).
	Offset, End int64
	// For a line read: the first and last line in Data (the last may be
	// cut short when Truncated), the lines in the bytes scanned, and the
	// bytes scanned (less than Size when the scan's bound stopped it).
	StartLine, EndLine, TotalLines, Scanned int64
	// Cuts are the lines MaxLineChars cut, in order. Each is in Data as
	// its first MaxLineChars characters and its "\n".
	Cuts []agentproto.LineCut
}

// ReadFile reads up to maxBytes of a file (and no more than length, when
// length is not 0). The data frames are copied once, into a buffer that
// starts at one chunk and, for a longer file, grows once to the most the
// read may return; so a small read does not allocate the cap, and a large
// one is not copied again and again as a doubling buffer would be.
func (c *Conn) ReadFile(ctx context.Context, path string, offset, length, maxBytes int64) (ReadResult, error) {
	return c.Read(ctx, agentproto.ReadRequest{Path: path, Offset: offset, Length: length, Max: maxBytes})
}

// Read is ReadFile for any read request, a byte range or lines.
func (c *Conn) Read(ctx context.Context, req agentproto.ReadRequest) (ReadResult, error) {
	var res ReadResult
	limit := req.Max
	if req.Length > 0 && req.Length < limit {
		limit = req.Length
	}
	buf := make([]byte, 0, min(limit, agentproto.ChunkSize))
	err := c.roundTrip(ctx, request{
		kind: agentproto.KindRead, body: req, timeout: opTimeout,
		onData: func(p []byte) error {
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
		onResult: func(f agentproto.Frame) error {
			var r agentproto.ReadResult
			if err := f.Decode(&r); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			if r.Offset < 0 || r.End < r.Offset || r.StartLine < 0 || r.EndLine < 0 || r.TotalLines < 0 || r.EndLine > r.TotalLines ||
				r.Scanned < 0 || (req.StartLine == 0 && r.Offset != req.Offset) || !validCuts(req, r, int64(len(buf))) {
				return fmt.Errorf("%w: read result out of bounds: %+v", errProtocol, r)
			}
			res = ReadResult{Data: buf, Size: max(r.Size, 0), Truncated: r.Truncated, Offset: r.Offset, End: r.End,
				StartLine: r.StartLine, EndLine: r.EndLine, TotalLines: r.TotalLines, Scanned: r.Scanned, Cuts: r.Cuts}
			return nil
		},
	})
	return res, err
}

// validCuts checks a read result's cut lines: only a line read that asked
// for cuts has them, at most one per MaxLineChars bytes of content (a cut
// line keeps that many characters, a byte at least each) and one more,
// in order, within the lines the content holds.
func validCuts(req agentproto.ReadRequest, r agentproto.ReadResult, n int64) bool {
	if len(r.Cuts) == 0 {
		return true
	}
	if req.StartLine == 0 || req.MaxLineChars <= 0 || int64(len(r.Cuts)) > n/req.MaxLineChars+1 {
		return false
	}
	last := int64(0)
	for _, c := range r.Cuts {
		if c.Line <= last || c.Line < r.StartLine || c.Line > r.EndLine || c.Offset < 0 || c.Rest < 0 {
			return false
		}
		last = c.Line
	}
	return true
}

// WriteResult is what a write did.
type WriteResult struct {
	Written int64
	Size    int64
}

// WriteFile writes exactly size bytes read from r. The content goes to the
// agent a chunk at a time, so the server never holds a second copy of it.
// If r fails or ends early, the agent is sent less than size bytes, which
// leaves the file as it was, and r's error is returned.
func (c *Conn) WriteFile(ctx context.Context, path string, r io.Reader, size int64, appendTo bool, mode uint32) (WriteResult, error) {
	var res WriteResult
	var inErr error
	err := c.roundTrip(ctx, request{
		kind: agentproto.KindWrite, body: agentproto.WriteRequest{Path: path, Append: appendTo, Mode: mode, Size: size}, timeout: opTimeout,
		input: func(p *pending) error {
			inErr = c.sendFrom(p, r, size)
			return inErr
		},
		onResult: func(f agentproto.Frame) error {
			var r agentproto.WriteResult
			if err := f.Decode(&r); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			res = WriteResult{Written: r.Written, Size: r.Size}
			return nil
		},
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
func (c *Conn) sendFrom(p *pending, r io.Reader, size int64) error {
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

// ListOptions say what a list lists: see workspace.ListOptions.
type ListOptions struct {
	Recursive  bool
	MaxEntries int
	Pattern    string
	Prune      []string
	MaxScan    int
}

// ListResult is a list's entries, and whether it was cut short.
type ListResult struct {
	Entries   []Entry
	Truncated bool
	// Scanned is the directory entries the agent looked at; it reaches
	// MaxScan when that bound ended the list.
	Scanned int
}

// List lists a directory, at most o.MaxEntries entries and
// policy.ListBytes(o.MaxEntries) bytes of the agent's stream: a list past
// either is cut short and reported truncated.
func (c *Conn) List(ctx context.Context, path string, o ListOptions) (ListResult, error) {
	var res ListResult
	var got int64
	maxEntries := o.MaxEntries
	maxBytes := policy.ListBytes(maxEntries)
	err := c.roundTrip(ctx, request{
		kind: agentproto.KindList, body: agentproto.ListRequest{Path: path, Recursive: o.Recursive, Max: maxEntries, Pattern: o.Pattern, Prune: o.Prune, MaxScan: o.MaxScan}, timeout: opTimeout,
		onData: func(p []byte) error {
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
				if len(res.Entries) >= maxEntries || !validEntry(e) {
					return fmt.Errorf("%w: list entry out of bounds", errProtocol)
				}
				res.Entries = append(res.Entries, e)
				p = rest
			}
			return nil
		},
		onResult: func(f agentproto.Frame) error {
			var r agentproto.ListResult
			if err := f.Decode(&r); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			if r.Scanned < 0 || (o.MaxScan > 0 && r.Scanned > o.MaxScan) {
				return fmt.Errorf("%w: list result out of bounds: %+v", errProtocol, r)
			}
			res.Truncated, res.Scanned = r.Truncated, r.Scanned
			return nil
		},
	})
	if errors.Is(err, errListFull) {
		res.Truncated = true
		return res, nil
	}
	return res, err
}

func validEntry(e Entry) bool {
	switch e.Type {
	case agentproto.TypeFile, agentproto.TypeDir, agentproto.TypeSymlink, agentproto.TypeOther:
	default:
		return false
	}
	return e.Path != "" && len(e.Path) <= 2*policy.MaxPathBytes && len(e.Target) <= 2*policy.MaxPathBytes &&
		utf8.ValidString(e.Path) && utf8.ValidString(e.Target) && e.Size >= 0 && e.Count >= 0 && (e.Count == 0 || e.Pruned)
}

// Resolve finds each of names as the agent would run it, from cwd (see
// agentproto.ResolveRequest).
func (c *Conn) Resolve(ctx context.Context, names []string, cwd string) ([]string, error) {
	var out []string
	err := c.roundTrip(ctx, request{
		kind: agentproto.KindResolve, body: agentproto.ResolveRequest{Names: names, Cwd: cwd}, timeout: opTimeout,
		onResult: func(f agentproto.Frame) error {
			var r agentproto.ResolveResult
			if err := f.Decode(&r); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			if len(r.Paths) != len(names) {
				return fmt.Errorf("%w: resolve answered %d paths for %d names", errProtocol, len(r.Paths), len(names))
			}
			out = r.Paths
			return nil
		},
	})
	return out, err
}

// Snapshot streams a tar of the workspace into w, never more than
// lim.MaxBytes bytes.
func (c *Conn) Snapshot(ctx context.Context, w io.Writer, lim agentproto.Limits) (agentproto.SnapshotResult, error) {
	var res agentproto.SnapshotResult
	var n int64
	err := c.roundTrip(ctx, request{
		kind: agentproto.KindSnapshot, body: agentproto.SnapshotRequest{Limits: lim}, timeout: bulkTimeout,
		onData: func(p []byte) error {
			n += int64(len(p))
			if lim.MaxBytes > 0 && n > lim.MaxBytes {
				return fmt.Errorf("%w: snapshot stream exceeds %d bytes", errProtocol, lim.MaxBytes)
			}
			if _, err := w.Write(p); err != nil {
				return errLocal{err}
			}
			return nil
		},
		onResult: func(f agentproto.Frame) error {
			if err := f.Decode(&res); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			return nil
		},
	})
	return res, err
}

// Restore replaces the workspace with the tar stream in data.
func (c *Conn) Restore(ctx context.Context, data io.Reader, lim agentproto.Limits) (agentproto.RestoreResult, error) {
	var res agentproto.RestoreResult
	err := c.roundTrip(ctx, request{
		kind: agentproto.KindRestore, body: agentproto.RestoreRequest{Limits: lim}, timeout: bulkTimeout,
		input: func(p *pending) error {
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
		},
		onResult: func(f agentproto.Frame) error {
			if err := f.Decode(&res); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			return nil
		},
	})
	return res, err
}

// errLocal wraps a failure on the server's side of a transfer (a disk
// error, say), which says nothing about the agent.
type errLocal struct{ err error }

func (e errLocal) Error() string { return e.err.Error() }
func (e errLocal) Unwrap() error { return e.err }

// request is one request that is not exec, and what to do with each frame
// of its answer. The callbacks but onResult are optional: a frame of a kind
// whose callback is nil breaks the protocol.
type request struct {
	kind agentproto.Kind
	body any
	// timeout bounds the request (the caller's deadline, when sooner,
	// comes first); past it the agent is told to cancel.
	timeout time.Duration
	// input sends the request's input (data frames and eof), beside the
	// reading of its answer; the round trip waits for it to return.
	input func(*pending) error
	// onData takes the payload of each data frame.
	onData func([]byte) error
	// onStream takes the payload of each stdout (0) or stderr (1) frame.
	onStream func(stream int, p []byte) error
	// onResult decodes and checks the result frame, which ends the request.
	// An error from it is a protocol violation.
	onResult func(agentproto.Frame) error
}

// roundTrip runs r: send it (and its input), pass the answer's frames to
// its callbacks, until the result or an error frame. A protocol violation
// ends the connection. When ctx ends or the timeout passes, the agent is
// told to cancel.
func (c *Conn) roundTrip(ctx context.Context, r request) error {
	kind, timeout := r.kind, r.timeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl).Round(time.Millisecond), 0) // for the message: the caller's deadline comes first
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// The agent gets the same deadline: past it the server has given up,
	// and the agent stops too.
	p, err := c.open(ctx, kind, r.body)
	if err != nil {
		return unavailable(err)
	}
	defer c.close(p)
	if r.input != nil {
		inErr := make(chan error, 1)
		go func() { inErr <- r.input(p) }()
		defer func() {
			if err := <-inErr; err != nil && !errors.As(err, new(errLocal)) {
				c.log.Debug("sending request input", "err", err)
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
			if r.onData == nil {
				err = fmt.Errorf("%w: data frame in answer to %s", errProtocol, kind)
			} else {
				err = r.onData(f.Payload)
			}
		case agentproto.KindStdout, agentproto.KindStderr:
			if r.onStream == nil {
				err = fmt.Errorf("%w: %s frame in answer to %s", errProtocol, f.Kind, kind)
			} else if f.Kind == agentproto.KindStdout {
				err = r.onStream(0, f.Payload)
			} else {
				err = r.onStream(1, f.Payload)
			}
		case agentproto.KindResult:
			if err := r.onResult(f); err != nil {
				c.Fail(err)
				return unavailable(c.Err())
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
			c.Fail(err)
			return unavailable(c.Err())
		}
	}
}

func (c *Conn) decodeError(f agentproto.Frame) error {
	var e agentproto.Error
	if err := f.Decode(&e); err != nil {
		c.Fail(fmt.Errorf("%w: %v", errProtocol, err))
		return unavailable(c.Err())
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
		"the sandbox stopped (%v); its workspace is lost and its jobs ended. Call again: the next call starts a fresh sandbox, with no jobs", err)
}
