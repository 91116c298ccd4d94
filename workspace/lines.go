package workspace

import (
	"bytes"
	"io"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// ReadLines writes lines start to end (1-based, inclusive; end 0 means to
// the last line) of the regular file rel to dst, at most max bytes of them,
// opened like ReadFile opens a file. A line ends with "\n" (which is part of
// it); a last line without one counts as a line.
//
// When max stops the read, the content ends after the last whole line that
// fits, or, when not even the first line fits, after max bytes of it; then
// Truncated is set. The result says where the content starts (Offset),
// which lines it holds (StartLine, EndLine: the last one, which may be cut)
// and how many lines the file has (TotalLines), so the caller can say where
// to read on. An end past the last line reads to the end; a start past the
// last line is INVALID_ARGUMENT naming the number of lines (a start of 1 on
// an empty file reads nothing).
//
// The file is read twice: once to count its lines and find the range, once
// to send it; a file that changes in between sends what it holds by then,
// never more than max bytes.
func (w *Workspace) ReadLines(rel string, start, end, maxBytes int64, dst io.Writer) (agentproto.ReadResult, error) {
	const op = "read"
	var res agentproto.ReadResult
	p, err := parsePath(op, rel)
	if err != nil {
		return res, err
	}
	switch {
	case start < 1:
		return res, errcode.Errorf(errcode.InvalidArgument,
			"read %s: start_line must be 1 or more (lines are numbered from 1), got %d", quote(rel), start)
	case end != 0 && end < start:
		return res, errcode.Errorf(errcode.InvalidArgument,
			"read %s: end_line %d is before start_line %d; give an end_line of at least %d, or leave it out to read to the end", quote(rel), end, start, start)
	case maxBytes < 0:
		return res, errcode.Errorf(errcode.InvalidArgument, "read %s: max must not be negative (got %d)", quote(rel), maxBytes)
	}
	root, err := w.enter()
	if err != nil {
		return res, err
	}
	defer w.mu.RUnlock()
	fd, st, err := openRegular(root, p, op, rel)
	if err != nil {
		return res, err
	}
	defer closeFd(fd)
	res.Size = st.Size

	sc, err := scanLines(fd, start, end, maxBytes)
	if err != nil {
		return res, fsError(op, rel, err)
	}
	if start > sc.total && !(start == 1 && sc.total == 0) {
		return res, errcode.Errorf(errcode.InvalidArgument,
			"read %s: start_line %d is past the end of the file, which has %d lines; give a start_line of at most %d", quote(rel), start, sc.total, max(sc.total, 1))
	}
	res.Size = max(res.Size, sc.size)
	res.Offset, res.StartLine, res.TotalLines = sc.from, start, sc.total
	sent, err := sendRange(fd, sc.from, sc.to-sc.from, dst)
	if err != nil {
		return res, unwrapDst(op, rel, err)
	}
	res.EndLine = sc.lastLine
	res.Truncated = sc.cut || sent < sc.to-sc.from
	return res, nil
}

// lineScan is where a line range lies in a file.
type lineScan struct {
	total    int64 // lines in the file
	size     int64 // bytes seen
	from, to int64 // the byte range to send
	lastLine int64 // the last line in [from, to)
	cut      bool  // max stopped the range before the lines asked for ended
}

// scanLines reads fd once and finds lines start..end (end 0: to the last)
// and the range of them that fits in max bytes.
func scanLines(fd int, start, end, limit int64) (lineScan, error) {
	var sc lineScan
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	line := int64(1) // the line the next byte belongs to
	fromSet := start == 1
	endOff := int64(-1) // the byte after the last line asked for, once known
	fit := int64(-1)    // the byte after the last whole line that fits in max
	fitLine := int64(0)
	var off int64
	var last byte
	for {
		n, err := unix.Pread(fd, buf, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return sc, err
		}
		if n == 0 {
			break
		}
		chunk := buf[:n]
		base := off
		for len(chunk) > 0 {
			i := bytes.IndexByte(chunk, '\n')
			if i < 0 {
				break
			}
			nl := base + int64(i) // offset of this '\n', which ends line `line`
			if line >= start && (end == 0 || line <= end) {
				if nl+1-sc.from <= limit {
					fit, fitLine = nl+1, line
				}
				if line == end {
					endOff = nl + 1
				}
			}
			line++
			if line == start {
				sc.from, fromSet = nl+1, true
			}
			base = nl + 1
			chunk = chunk[i+1:]
		}
		last = buf[n-1]
		off += int64(n)
	}
	sc.size = off
	sc.total = line - 1
	if off > 0 && last != '\n' {
		sc.total++ // a last line without its "\n"
	}
	if !fromSet {
		sc.from = off
	}
	if endOff < 0 {
		endOff = off // to the end of the file
	}
	want := endOff - sc.from
	switch {
	case want <= limit:
		sc.to, sc.lastLine = endOff, lastLineOf(end, sc.total)
	case fit > sc.from:
		sc.to, sc.lastLine, sc.cut = fit, fitLine, true
	default:
		// Not even the first line fits: send the start of it.
		sc.to, sc.lastLine, sc.cut = sc.from+limit, start, true
	}
	if sc.to <= sc.from {
		sc.lastLine = 0
	}
	return sc, nil
}

// lastLineOf is the last line of a range that ends at end (0: at the last
// line of a file of total lines).
func lastLineOf(end, total int64) int64 {
	if end == 0 || end > total {
		return total
	}
	return end
}
