package workspace

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"unicode"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// maxMatchLines is how many line numbers an ambiguous edit's message names.
const maxMatchLines = 20

// EditFile replaces old text with new text in the regular file rel. src
// holds oldSize bytes of the text to find followed by newSize bytes of its
// replacement (read exactly, like WriteFile reads its content). The match
// is exact, bytes for bytes: old must occur once, or any number of times
// with replaceAll (each occurrence is replaced). An old text that does not
// occur is NOT_FOUND, with a hint at the nearest place that differs only in
// whitespace when there is one; one that occurs more than once without
// replaceAll is INVALID_ARGUMENT naming the count and the lines.
//
// An empty old text creates the file with the new text when rel does not
// exist (missing parent directories are created as WriteFile creates them),
// and fills an empty file; on a file with content it is INVALID_ARGUMENT.
//
// The file is replaced atomically, like WriteFile replaces one: the new
// content goes to a temporary file in the same directory, which gets the
// old file's permission bits (setuid, setgid and sticky dropped), and is
// renamed over rel; a reader sees the old or the new content. The parent
// is resolved like every path (symlinks inside followed); rel itself must
// be a regular file, not a symlink (the edit would replace the link, so it
// is refused: edit the target). A file that is replaced or grows while it
// is edited makes the edit fail with nothing changed, rather than lose the
// other change. The file before and after is at most maxFile bytes
// (TOO_LARGE otherwise; 0 means no limit).
func (w *Workspace) EditFile(rel string, src io.Reader, oldSize, newSize int64, replaceAll bool, maxFile int64) (agentproto.EditResult, error) {
	const op = "edit"
	var res agentproto.EditResult
	p, err := parsePath(op, rel)
	if err != nil {
		return res, err
	}
	switch {
	case len(p.comps) == 0 || p.dirOnly:
		return res, errcode.Errorf(errcode.InvalidArgument,
			`edit %s: that names a directory; give the path of a file, without a trailing "/"`, quote(rel))
	case oldSize < 0 || newSize < 0 || maxFile < 0:
		return res, errcode.Errorf(errcode.InvalidArgument, "edit %s: negative sizes (%d, %d, %d)", quote(rel), oldSize, newSize, maxFile)
	case maxFile > 0 && (oldSize > maxFile || newSize > maxFile):
		return res, errcode.Errorf(errcode.TooLarge,
			"edit %s: old_string and new_string may each be at most %d bytes (this server's file cap); edit in smaller steps", quote(rel), maxFile)
	}
	// Both strings arrive first, whatever happens next: the caller is
	// sending them.
	texts := make([]byte, 0, oldSize+newSize)
	if err := copyExact(op, rel, src, oldSize+newSize, func(b []byte) error { texts = append(texts, b...); return nil }); err != nil {
		return res, unwrapDst(op, rel, err)
	}
	old, repl := texts[:oldSize], texts[oldSize:]
	base := p.comps[len(p.comps)-1]

	root, err := w.enter()
	if err != nil {
		return res, err
	}
	defer w.mu.RUnlock()

	parent := wsPath{rel: rel, comps: p.comps[:len(p.comps)-1]}
	dir, err := openBeneath(root, parent.String(), unix.O_PATH|unix.O_DIRECTORY, resolveFlags)
	if err == unix.ENOENT && len(old) == 0 {
		dir, err = mkdirParents(root, parent.comps, resolveFlags, op, rel)
	}
	if err != nil {
		return res, fsError(op, rel, err)
	}
	defer closeFd(dir)

	fd, err := openat(dir, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	switch {
	case err == unix.ENOENT && len(old) == 0:
		return createEdited(dir, base, rel, repl, maxFile)
	case err == unix.ELOOP:
		return res, errcode.Errorf(errcode.InvalidArgument,
			"edit %s: it is a symlink; edit the file it points to instead (sandbox_list shows the target)", quote(rel))
	case err == unix.ENOENT:
		return res, errcode.Errorf(errcode.NotFound,
			"edit %s: no such file in the workspace; check the path with sandbox_list, or pass an empty old_string to create the file", quote(rel))
	case err != nil:
		return res, fsError(op, rel, err)
	}
	defer closeFd(fd)
	st, err := fstat(fd)
	if err != nil {
		return res, fsError(op, rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return res, notRegular(op, rel, st.Mode)
	}
	if err := clearNonblock(fd); err != nil {
		return res, fsError(op, rel, err)
	}
	if maxFile > 0 && st.Size > maxFile {
		return res, errcode.Errorf(errcode.TooLarge,
			"edit %s: the file is %d bytes, more than this server's cap of %d; change it with sandbox_exec (sed, patch) instead", quote(rel), st.Size, maxFile)
	}
	data, err := readAllFd(fd, st.Size)
	if err != nil {
		return res, fsError(op, rel, err)
	}

	var out []byte
	switch n := bytes.Count(data, old); {
	case len(old) == 0 && len(data) > 0:
		return res, errcode.Errorf(errcode.InvalidArgument,
			"edit %s: old_string is empty, but the file has %d bytes; give the text to replace, or use sandbox_write_file to replace the whole file", quote(rel), len(data))
	case len(old) == 0:
		out, res.Replacements = repl, 1
	case n == 0:
		return res, errcode.Errorf(errcode.NotFound, "edit %s: old_string does not occur in the file. %s", quote(rel), nearMiss(data, old))
	case n > 1 && !replaceAll:
		return res, errcode.Errorf(errcode.InvalidArgument,
			"edit %s: old_string occurs %d times (%s); add surrounding lines to old_string so it occurs once, or set replace_all to replace every one",
			quote(rel), n, matchLines(data, old))
	default:
		if !replaceAll {
			n = 1
		}
		if grown := int64(len(data)) + int64(n)*(int64(len(repl))-int64(len(old))); maxFile > 0 && grown > maxFile {
			return res, errcode.Errorf(errcode.TooLarge,
				"edit %s: the file would be %d bytes, more than this server's cap of %d; make a smaller change", quote(rel), grown, maxFile)
		}
		out, res.Replacements = bytes.Replace(data, old, repl, n), n
	}

	// The file must still be the one read: replaced or written to since,
	// the edit would undo that change.
	if cur, err := lstatAt(dir, base); err != nil || cur.Ino != st.Ino || cur.Dev != st.Dev {
		return res, errcode.Errorf(errcode.InvalidArgument,
			"edit %s: the file was replaced while it was being edited; read it again and retry", quote(rel))
	}
	if now, err := fstat(fd); err != nil || now.Size != st.Size || now.Mtim != st.Mtim {
		return res, errcode.Errorf(errcode.InvalidArgument,
			"edit %s: the file changed while it was being edited; read it again and retry", quote(rel))
	}
	wr, err := replaceFile(dir, base, op, rel, bytes.NewReader(out), int64(len(out)), st.Mode&0o777)
	if err != nil {
		return res, err
	}
	res.Size = wr.Size
	return res, nil
}

// createEdited creates base in dir with content, for an edit with an empty
// old text on a missing file. A file created meanwhile is left alone.
func createEdited(dir int, base, rel string, content []byte, maxFile int64) (agentproto.EditResult, error) {
	const op = "edit"
	var res agentproto.EditResult
	if maxFile > 0 && int64(len(content)) > maxFile {
		return res, errcode.Errorf(errcode.TooLarge,
			"edit %s: new_string is %d bytes, more than this server's cap of %d", quote(rel), len(content), maxFile)
	}
	tmp, fd, err := createTemp(dir)
	if err != nil {
		return res, fsError(op, rel, err)
	}
	defer closeFd(fd)
	done := false
	defer func() {
		if !done {
			_ = unix.Unlinkat(dir, tmp, 0)
		}
	}()
	if err := writeAll(fd, content); err != nil {
		return res, fsError(op, rel, err)
	}
	if err := unix.Fchmod(fd, 0o644); err != nil {
		return res, fsError(op, rel, err)
	}
	err = unix.Renameat2(dir, tmp, dir, base, unix.RENAME_NOREPLACE)
	if err == unix.EEXIST {
		return res, errcode.Errorf(errcode.InvalidArgument,
			"edit %s: the file was created by something else while this edit ran; read it and edit it with an old_string", quote(rel))
	}
	if err != nil {
		return res, fsError(op, rel, err)
	}
	done = true
	return agentproto.EditResult{Replacements: 1, Size: int64(len(content)), Created: true}, nil
}

// readAllFd reads the file open as fd, expecting size bytes; one that has
// grown meanwhile is read to its end.
func readAllFd(fd int, size int64) ([]byte, error) {
	buf := make([]byte, 0, size+1)
	var off int64
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := unix.Pread(fd, buf[len(buf):cap(buf)], off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
		off += int64(n)
	}
}

// matchLines names the lines where old starts in data: "lines 3, 17 and 40",
// at most maxMatchLines of them.
func matchLines(data, old []byte) string {
	var lines []string
	line, pos := 1, 0
	for i := 0; ; {
		j := bytes.Index(data[i:], old)
		if j < 0 {
			break
		}
		at := i + j
		line += bytes.Count(data[pos:at], []byte{'\n'})
		pos = at
		if len(lines) == maxMatchLines {
			lines = append(lines, "…")
			break
		}
		lines = append(lines, fmt.Sprint(line))
		i = at + len(old)
	}
	switch len(lines) {
	case 1:
		return "line " + lines[0]
	default:
		return "lines " + strings.Join(lines[:len(lines)-1], ", ") + " and " + lines[len(lines)-1]
	}
}

// nearMiss is the hint of an edit whose old text does not occur: the place
// where it does occur if whitespace is ignored (indentation, tabs against
// spaces, spaces around punctuation, line ends), or where its first line
// does, or how to find the right text. Its lines are matched as the file's
// lines with every whitespace character removed: the first may end a file
// line, the last may start one, the others must match whole.
func nearMiss(data, old []byte) string {
	const fallback = "Read the file again (sandbox_read_file with start_line and end_line) and copy the text exactly, whitespace included."
	oldLines := splitLines(string(old))
	for len(oldLines) > 0 && squash(oldLines[len(oldLines)-1]) == "" {
		oldLines = oldLines[:len(oldLines)-1]
	}
	for len(oldLines) > 0 && squash(oldLines[0]) == "" {
		oldLines = oldLines[1:]
	}
	if len(oldLines) == 0 {
		return "old_string holds only whitespace, which is not in the file as given. " + fallback
	}
	lines := splitLines(string(data))
	flat := make([]string, len(lines))
	for i, l := range lines {
		flat[i] = squash(l)
	}
	want := make([]string, len(oldLines))
	for i, l := range oldLines {
		want[i] = squash(l)
	}
	k := len(want)
	matches := func(i int) bool {
		if k == 1 {
			return strings.Contains(flat[i], want[0])
		}
		if i+k > len(flat) || !strings.HasSuffix(flat[i], want[0]) || !strings.HasPrefix(flat[i+k-1], want[k-1]) {
			return false
		}
		for j := 1; j < k-1; j++ {
			if flat[i+j] != want[j] {
				return false
			}
		}
		return true
	}
	firstAt := -1
	for i := range flat {
		if matches(i) {
			where := fmt.Sprintf("line %d", i+1)
			if k > 1 {
				where = fmt.Sprintf("lines %d-%d", i+1, i+k)
			}
			return fmt.Sprintf("The nearest match is %s, which differs only in whitespace (indentation, tabs, spaces or line ends); line %d is exactly %s. Copy the text exactly as the file has it.",
				where, i+1, qname(lines[i]))
		}
		if firstAt < 0 && k > 1 && strings.HasSuffix(flat[i], want[0]) {
			firstAt = i
		}
	}
	if firstAt >= 0 {
		return fmt.Sprintf("Its first line matches line %d (%s) apart from whitespace, but the lines after it differ. %s",
			firstAt+1, qname(lines[firstAt]), fallback)
	}
	return fallback
}

// splitLines splits s at "\n", keeping a "\r" before it.
func splitLines(s string) []string { return strings.Split(s, "\n") }

// squash is s without its whitespace.
func squash(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) {
			return -1
		}
		return r
	}, s)
}
