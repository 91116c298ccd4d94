package workspace

import (
	"bytes"
	"context"
	"io"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// Lines is the range of lines ReadLines reads and the bounds it keeps to.
type Lines struct {
	// Start and End are the first and the last line (1-based, inclusive);
	// End 0 means to the last line.
	Start, End int64
	// Max is the most bytes of content sent.
	Max int64
	// MaxScan is the most bytes of the file looked at, from its first
	// byte, to find the lines and count them; 0 means no bound. Lines past
	// it cannot be read by number.
	MaxScan int64
	// MaxLineChars, if not 0, cuts each line longer than this many
	// characters to its first MaxLineChars (keeping its "\n").
	MaxLineChars int64
}

// ReadLines writes lines l.Start to l.End of the regular file rel to dst,
// at most l.Max bytes of them, opened like ReadFile opens a file. A line
// ends with "\n" (which is part of it); a last line without one counts as a
// line.
//
// The file is read once, from its first byte, up to l.MaxScan bytes: the
// lines are found and counted in those bytes only, whatever size the file
// claims (a sparse file of 8 EiB costs l.MaxScan bytes of reading, not
// 8 EiB). ctx bounds the time: when it ends the read stops and fails with
// TIMEOUT.
//
// When l.Max stops the read, the content ends after the last whole line
// that fits, or, when not even the first line fits, after l.Max bytes of
// it; then Truncated is set. With l.MaxLineChars, a longer line is sent cut
// to that many characters (a character is a byte that starts a UTF-8
// sequence, with the bytes that continue it) followed by its "\n", and the
// result's Cuts say where the rest of it lies. The result says where the
// content starts (Offset) and where it ends in the file (End), which lines
// it holds (StartLine, EndLine: the last one, which may be cut), how many
// lines the bytes scanned have (TotalLines) and how many bytes were scanned
// (Scanned; less than Size when l.MaxScan stopped the scan), so the caller
// can say where to read on. An end past the last line reads to the end; a
// start past the last line is INVALID_ARGUMENT naming the number of lines
// (a start of 1 on an empty file reads nothing), and so is a start past the
// lines in the bytes scanned, saying how to read further.
//
// The content is read from the file a second time to be sent, so a file
// that changes meanwhile sends what it holds by then, never more than
// l.Max bytes.
func (w *Workspace) ReadLines(ctx context.Context, rel string, l Lines, dst io.Writer) (agentproto.ReadResult, error) {
	const op = "read"
	var res agentproto.ReadResult
	p, err := parsePath(op, rel)
	if err != nil {
		return res, err
	}
	switch {
	case l.Start < 1:
		return res, errcode.Errorf(errcode.InvalidArgument,
			"read %s: the first line must be 1 or more (lines are numbered from 1), got %d", quote(rel), l.Start)
	case l.End != 0 && l.End < l.Start:
		return res, errcode.Errorf(errcode.InvalidArgument,
			"read %s: the last line %d is before the first line %d; read at least one line", quote(rel), l.End, l.Start)
	case l.Max < 0 || l.MaxScan < 0 || l.MaxLineChars < 0:
		return res, errcode.Errorf(errcode.InvalidArgument, "read %s: negative bounds (%d, %d, %d)", quote(rel), l.Max, l.MaxScan, l.MaxLineChars)
	}
	root, err := w.enter()
	if err != nil {
		return res, err
	}
	defer w.mu.RUnlock()
	fd, st, err := openRegularPath(root, p, op, rel)
	if err != nil {
		return res, err
	}
	defer closeFd(fd)

	out := newEmitter(fd, dst)
	defer out.release()
	r := lineReader{ctx: ctx, l: l, fd: fd, out: out}
	if err := r.scan(); err != nil {
		return res, readErr(ctx, op, rel, err)
	}
	if err := out.flush(); err != nil {
		return res, unwrapDst(op, rel, err)
	}
	res = r.res
	res.Size = max(st.Size, r.scanned)
	res.Scanned = r.scanned
	res.StartLine, res.TotalLines = l.Start, r.total
	if l.Start > r.total && !(l.Start == 1 && r.total == 0) {
		if r.stopped {
			return agentproto.ReadResult{}, errcode.Errorf(errcode.InvalidArgument,
				"read %s: line %d is not in the first %d bytes of the file, which is as far as lines are counted (they hold %d lines; the file has %d bytes); "+
					"read further by bytes (byte_offset), or search with rg, or print lines with sed -n or tail in sandbox_exec",
				quote(rel), l.Start, r.scanned, r.total, res.Size)
		}
		return agentproto.ReadResult{}, errcode.Errorf(errcode.InvalidArgument,
			"read %s: line %d is past the end of the file, which has %d lines; start at line %d at most", quote(rel), l.Start, r.total, max(r.total, 1))
	}
	if res.StartLine > res.EndLine {
		res.EndLine = 0 // nothing sent
	}
	// Max cut the range short, or the scan's bound did: lines of the range
	// may lie past the bytes scanned.
	res.Truncated = r.short || (r.stopped && !r.ended)
	if res.End < res.Offset {
		res.End = res.Offset
	}
	return res, nil
}

// readErr is the error of a read that failed while it ran: ctx's end, the
// caller's writer's error, or a file system error.
func readErr(ctx context.Context, op, rel string, err error) error {
	if ctx.Err() != nil {
		return stopped(ctx, op, rel)
	}
	return unwrapDst(op, rel, err)
}

// lineReader is one ReadLines scan: it reads the file once, counting lines,
// and sends the lines of the range through out as each one ends.
type lineReader struct {
	ctx context.Context
	l   Lines
	fd  int
	out *emitter
	res agentproto.ReadResult

	scanned int64 // bytes looked at
	total   int64 // lines in them
	stopped bool  // l.MaxScan ended the scan before the end of the file
	done    bool  // nothing more is sent: the range ended, or Max was reached
	ended   bool  // the range's last line (l.End) was sent
	short   bool  // Max stopped the content before the range ended
	sent    int64 // bytes of content sent
}

// scan reads the file from its first byte to its end or l.MaxScan.
func (r *lineReader) scan() error {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	l := r.l
	line := int64(1)    // the line the next byte belongs to
	var lineStart int64 // where that line starts
	var chars int64     // characters of that line so far, while they are counted
	cutAt := int64(-1)  // where its character l.MaxLineChars+1 starts, once seen
	if l.Start == 1 {
		r.res.Offset = 0
	}
	inRange := func() bool { return !r.done && line >= l.Start && (l.End == 0 || line <= l.End) }
	var off int64
	for {
		if err := r.ctx.Err(); err != nil {
			return err
		}
		want := int64(len(buf))
		if l.MaxScan > 0 {
			want = min(want, l.MaxScan-off)
		}
		if want <= 0 {
			// The bound: is there more?
			var one [1]byte
			if n, err := pread(r.fd, one[:], off); err != nil {
				return err
			} else if n > 0 {
				r.stopped = true
			}
			break
		}
		n, err := pread(r.fd, buf[:want], off)
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
		chunk := buf[:n]
		if !inRange() && line >= l.Start {
			// Past the range: only count.
			line += int64(bytes.Count(chunk, []byte{'\n'}))
			if chunk[n-1] == '\n' {
				lineStart = off + int64(n)
			} else {
				lineStart = off // somewhere before the chunk's end: the line is not empty
			}
			off += int64(n)
			continue
		}
		for pos := 0; pos < n; {
			i := bytes.IndexByte(chunk[pos:], '\n')
			seg := chunk[pos:]
			if i >= 0 {
				seg = chunk[pos : pos+i]
			}
			if inRange() && l.MaxLineChars > 0 && cutAt < 0 {
				for j, b := range seg {
					if b&0xC0 == 0x80 {
						continue // continues a UTF-8 sequence
					}
					if chars == l.MaxLineChars {
						cutAt = off + int64(pos+j)
						break
					}
					chars++
				}
			}
			if i < 0 {
				break // the line goes on in the next chunk
			}
			nl := off + int64(pos+i)
			if inRange() {
				if err := r.finish(line, lineStart, nl+1, true, cutAt, true); err != nil {
					return err
				}
				if line == l.End && !r.done {
					r.done, r.ended = true, true
				}
			}
			line++
			lineStart, chars, cutAt = nl+1, 0, -1
			if line == l.Start {
				r.res.Offset = lineStart
			}
			pos += i + 1
		}
		off += int64(n)
	}
	r.scanned = off
	r.total = line - 1
	if lineStart < off {
		r.total++ // a last line without "\n", or one the bound cut
		if inRange() {
			if err := r.finish(line, lineStart, off, false, cutAt, !r.stopped); err != nil {
				return err
			}
		}
	}
	if line < l.Start {
		r.res.Offset = off
	}
	return nil
}

// finish sends line, which lies in [start, end) of the file (end is past
// its "\n" when nl), unless Max is reached: then it sends the first Max
// bytes of it if nothing was sent yet, and stops. cutAt is where the line
// is cut (-1: it is whole); complete is false for a line the scan's bound
// stopped inside.
func (r *lineReader) finish(line, start, end int64, nl bool, cutAt int64, complete bool) error {
	keep, addNL := end-start, false
	var cut *agentproto.LineCut
	if cutAt >= 0 {
		rest := end - cutAt
		if nl {
			rest--
		}
		keep, addNL = cutAt-start, nl
		cut = &agentproto.LineCut{Line: line, Offset: cutAt, Rest: rest}
	}
	size := keep
	if addNL {
		size++
	}
	if r.sent+size > r.l.Max || (!complete && cut == nil) {
		// It does not fit, or its end is not known: the content ends
		// before it, unless it is the first line.
		r.done, r.short = true, true
		if r.sent == 0 {
			n, err := r.out.fromFile(start, min(keep, r.l.Max))
			if err != nil {
				return err
			}
			r.sent += n
			if n > 0 {
				r.res.EndLine, r.res.End = line, start+n
			}
		}
		return nil
	}
	n, err := r.out.fromFile(start, keep)
	if err != nil {
		return err
	}
	r.sent += n
	if addNL {
		if err := r.out.byte('\n'); err != nil {
			return err
		}
		r.sent++
	}
	r.res.EndLine, r.res.End = line, end
	if cut != nil {
		r.res.Cuts = append(r.res.Cuts, *cut)
	}
	return nil
}

// lastLineOf is the last line of a range that ends at end (0: at the last
// line of a file of total lines).
func lastLineOf(end, total int64) int64 {
	if end == 0 || end > total {
		return total
	}
	return end
}

// pread is unix.Pread, retried on EINTR.
func pread(fd int, p []byte, off int64) (int, error) {
	for {
		n, err := unix.Pread(fd, p, off)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// emitter collects content into writes of at most agentproto.ChunkSize
// bytes to dst, read from the file open as fd or given byte by byte.
// Errors of dst come back as dstError.
type emitter struct {
	fd  int
	dst io.Writer
	bp  *[]byte
	buf []byte
}

func newEmitter(fd int, dst io.Writer) *emitter {
	bp := bufPool.Get().(*[]byte)
	return &emitter{fd: fd, dst: dst, bp: bp, buf: (*bp)[:0]}
}

func (e *emitter) release() { bufPool.Put(e.bp) }

// fromFile adds n bytes of the file from off, fewer if the file ends
// first, and returns how many it added.
func (e *emitter) fromFile(off, n int64) (int64, error) {
	var got int64
	for got < n {
		if len(e.buf) == cap(e.buf) {
			if err := e.flush(); err != nil {
				return got, err
			}
		}
		room := e.buf[len(e.buf):cap(e.buf)]
		k, err := pread(e.fd, room[:min(int64(len(room)), n-got)], off+got)
		if err != nil {
			return got, err
		}
		if k == 0 {
			break // the file shrank
		}
		e.buf = e.buf[:len(e.buf)+k]
		got += int64(k)
	}
	return got, nil
}

// byte adds b.
func (e *emitter) byte(b byte) error {
	if len(e.buf) == cap(e.buf) {
		if err := e.flush(); err != nil {
			return err
		}
	}
	e.buf = append(e.buf, b)
	return nil
}

// flush writes what was added.
func (e *emitter) flush() error {
	if len(e.buf) == 0 {
		return nil
	}
	_, err := e.dst.Write(e.buf)
	e.buf = e.buf[:0]
	if err != nil {
		return dstError{err}
	}
	return nil
}
