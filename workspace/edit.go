package workspace

import (
	"bytes"
	"context"
	"errors"
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

// EditFile makes the replacements edits describes in the regular file rel,
// in order, each in the text the ones before it left, all or nothing: the
// file changes only if every one applies. src holds each edit's old text
// followed by its new text, OldSize and NewSize bytes, edit after edit
// (read exactly, like WriteFile reads its content). The match is exact,
// bytes for bytes: an old text must occur once, or any number of times
// with ReplaceAll (each occurrence is replaced). An old text that does not
// occur is NOT_FOUND, with a hint at the nearest place that differs only in
// whitespace when there is one; one that occurs more than once without
// ReplaceAll is INVALID_ARGUMENT naming the count and the lines. With more
// than one edit, the message names the edit that failed ("edit 2 of 3").
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
// other change. The file before and after each edit is at most maxFile
// bytes (TOO_LARGE otherwise; 0 means no limit), and so is what is read of
// it: a file that grows past maxFile while it is read is not read further.
// The search for a near miss compares a bounded number of bytes (a few
// times the file's and the old text's size), and ctx bounds the time: when
// it ends the edit stops, changing nothing, and fails with TIMEOUT.
func (w *Workspace) EditFile(ctx context.Context, rel string, src io.Reader, edits []agentproto.EditSpec, maxFile int64) (agentproto.EditResult, error) {
	const op = "edit"
	var res agentproto.EditResult
	p, err := parsePath(op, rel)
	if err != nil {
		return res, err
	}
	texts, err := checkEdits(p, rel, edits, maxFile)
	if err != nil {
		return res, err
	}
	// The strings arrive first, whatever happens next: the caller is
	// sending them.
	all := make([]byte, 0, texts)
	if err := copyExact(op, rel, src, texts, func(b []byte) error { all = append(all, b...); return nil }); err != nil {
		return res, unwrapDst(op, rel, err)
	}
	base := p.comps[len(p.comps)-1]

	root, err := w.enter()
	if err != nil {
		return res, err
	}
	defer w.mu.RUnlock()

	createOnly := edits[0].OldSize == 0
	parent := wsPath{rel: rel, comps: p.comps[:len(p.comps)-1]}
	dir, err := openBeneath(root, parent.String(), unix.O_PATH|unix.O_DIRECTORY, resolveFlags)
	if err == unix.ENOENT && createOnly {
		dir, err = mkdirParents(root, parent.comps, resolveFlags, op, rel)
	}
	if err != nil {
		return res, fsError(op, rel, err)
	}
	defer closeFd(dir)

	fd, st, data, err := readEdited(ctx, dir, base, rel, maxFile)
	switch {
	case err == unix.ENOENT && createOnly:
		out, n, err := applyEdits(ctx, rel, nil, all, edits, maxFile)
		if err != nil {
			return res, err
		}
		return createEdited(dir, base, rel, out, n, maxFile)
	case err == unix.ENOENT:
		return res, errcode.Errorf(errcode.NotFound,
			"edit %s: no such file in the workspace; check the path with sandbox_list, or pass an empty old_string to create the file", quote(rel))
	case err != nil:
		return res, err
	}
	defer closeFd(fd)

	out, n, err := applyEdits(ctx, rel, data, all, edits, maxFile)
	if err != nil {
		return res, err
	}
	return replaceEdited(ctx, dir, base, rel, fd, st, out, n)
}

// checkEdits checks an edit request before anything is read: a file's path,
// 1 to MaxEdits edits, sizes neither negative nor past the cap, and strings
// that take at most twice the cap together. It returns the bytes the
// strings take.
func checkEdits(p wsPath, rel string, edits []agentproto.EditSpec, maxFile int64) (int64, error) {
	switch {
	case len(p.comps) == 0 || p.dirOnly:
		return 0, errcode.Errorf(errcode.InvalidArgument,
			`edit %s: that names a directory; give the path of a file, without a trailing "/"`, quote(rel))
	case len(edits) == 0 || len(edits) > agentproto.MaxEdits:
		return 0, errcode.Errorf(errcode.InvalidArgument, "edit %s: give 1 to %d edits, not %d", quote(rel), agentproto.MaxEdits, len(edits))
	case maxFile < 0:
		return 0, errcode.Errorf(errcode.InvalidArgument, "edit %s: negative cap %d", quote(rel), maxFile)
	}
	var texts int64
	for _, e := range edits {
		switch {
		case e.OldSize < 0 || e.NewSize < 0:
			return 0, errcode.Errorf(errcode.InvalidArgument, "edit %s: negative sizes (%d, %d)", quote(rel), e.OldSize, e.NewSize)
		case maxFile > 0 && (e.OldSize > maxFile || e.NewSize > maxFile):
			return 0, errcode.Errorf(errcode.TooLarge,
				"edit %s: old_string and new_string may each be at most %d bytes (this server's file cap); edit in smaller steps", quote(rel), maxFile)
		}
		texts += e.OldSize + e.NewSize
	}
	if maxFile > 0 && texts > 2*maxFile {
		return 0, errcode.Errorf(errcode.TooLarge,
			"edit %s: the edits' strings take %d bytes together, more than twice this server's file cap of %d; edit in smaller steps", quote(rel), texts, maxFile)
	}
	return texts, nil
}

// readEdited opens base in dir, which must be a regular file and not a
// symlink, and reads it whole, at most maxFile bytes. A missing file is
// unix.ENOENT, for the caller to create or refuse; every other error is
// worded. The caller closes fd.
func readEdited(ctx context.Context, dir int, base, rel string, maxFile int64) (fd int, st unix.Stat_t, data []byte, err error) {
	const op = "edit"
	fd, st, err = openRegular(func() (int, error) {
		return openat(dir, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	}, op, rel)
	switch {
	case err == unix.ENOENT:
		return -1, st, nil, err
	case err == unix.ELOOP:
		return -1, st, nil, errcode.Errorf(errcode.InvalidArgument,
			"edit %s: it is a symlink; edit the file it points to instead (sandbox_list shows the target)", quote(rel))
	case err != nil:
		if errno, ok := err.(unix.Errno); ok {
			err = fsError(op, rel, errno)
		}
		return -1, st, nil, err
	}
	tooLarge := func(size int64) error {
		return errcode.Errorf(errcode.TooLarge,
			"edit %s: the file is %d bytes, more than this server's cap of %d; change it with sandbox_exec (sed, patch) instead", quote(rel), size, maxFile)
	}
	if maxFile > 0 && st.Size > maxFile {
		closeFd(fd)
		return -1, st, nil, tooLarge(st.Size)
	}
	data, err = readAllFd(ctx, fd, st.Size, maxFile)
	switch {
	case err == errGrown:
		closeFd(fd)
		return -1, st, nil, tooLarge(int64(len(data)))
	case err != nil:
		closeFd(fd)
		return -1, st, nil, readErr(ctx, op, rel, err)
	}
	return fd, st, data, nil
}

// replaceEdited puts out, the edited content, in place of base, which fd
// (with stat st) read: only if the file is still the one read, unchanged,
// so the edit never undoes another change, and ctx has not ended.
func replaceEdited(ctx context.Context, dir int, base, rel string, fd int, st unix.Stat_t, out []byte, replacements int) (agentproto.EditResult, error) {
	const op = "edit"
	var res agentproto.EditResult
	if cur, err := lstatAt(dir, base); err != nil || cur.Ino != st.Ino || cur.Dev != st.Dev {
		return res, errcode.Errorf(errcode.InvalidArgument,
			"edit %s: the file was replaced while it was being edited; read it again and retry", quote(rel))
	}
	if now, err := fstat(fd); err != nil || now.Size != st.Size || now.Mtim != st.Mtim {
		return res, errcode.Errorf(errcode.InvalidArgument,
			"edit %s: the file changed while it was being edited; read it again and retry", quote(rel))
	}
	if err := ctx.Err(); err != nil {
		return res, stopped(ctx, op, rel)
	}
	wr, err := replaceFile(dir, base, op, rel, bytes.NewReader(out), int64(len(out)), st.Mode&0o777)
	if err != nil {
		return res, err
	}
	res.Replacements, res.Size = replacements, wr.Size
	return res, nil
}

// applyEdits makes edits in data (nil: the file does not exist yet), whose
// old and new texts lie one after another in texts, and returns the result
// and the number of replacements. It changes neither data nor texts.
func applyEdits(ctx context.Context, rel string, data, texts []byte, edits []agentproto.EditSpec, maxFile int64) ([]byte, int, error) {
	total := 0
	missing := data == nil
	for i, e := range edits {
		if ctx.Err() != nil {
			return nil, 0, stopped(ctx, "edit", rel)
		}
		old, repl := texts[:e.OldSize], texts[e.OldSize:e.OldSize+e.NewSize]
		texts = texts[e.OldSize+e.NewSize:]
		which, after := "", ""
		if len(edits) > 1 {
			which = fmt.Sprintf("edit %d of %d: ", i+1, len(edits))
			after = "; no edit was made"
			if i > 0 {
				which = fmt.Sprintf("edit %d of %d (on the text the edits before it left): ", i+1, len(edits))
			}
		}
		n := 0
		switch {
		case len(old) == 0 && len(data) > 0:
			return nil, 0, errcode.Errorf(errcode.InvalidArgument,
				"edit %s: %sold_string is empty, but the file has %d bytes; give the text to replace, or use sandbox_write_file to replace the whole file%s", quote(rel), which, len(data), after)
		case len(old) == 0:
			data, n = repl, 1
		case missing:
			return nil, 0, errcode.Errorf(errcode.NotFound,
				"edit %s: %sno such file in the workspace; check the path with sandbox_list, or pass an empty old_string to create the file%s", quote(rel), which, after)
		default:
			n = bytes.Count(data, old)
			switch {
			case n == 0:
				hint := nearMiss(ctx, data, old)
				if ctx.Err() != nil {
					return nil, 0, stopped(ctx, "edit", rel)
				}
				return nil, 0, errcode.Errorf(errcode.NotFound, "edit %s: %sold_string does not occur in the file%s. %s", quote(rel), which, after, hint)
			case n > 1 && !e.ReplaceAll:
				return nil, 0, errcode.Errorf(errcode.InvalidArgument,
					"edit %s: %sold_string occurs %d times (%s); add surrounding lines to old_string so it occurs once, or set replace_all to replace every one%s",
					quote(rel), which, n, matchLines(data, old), after)
			case !e.ReplaceAll:
				n = 1
			}
			if grown := int64(len(data)) + int64(n)*(int64(len(repl))-int64(len(old))); maxFile > 0 && grown > maxFile {
				return nil, 0, errcode.Errorf(errcode.TooLarge,
					"edit %s: %sthe file would be %d bytes, more than this server's cap of %d; make a smaller change%s", quote(rel), which, grown, maxFile, after)
			}
			data = bytes.Replace(data, old, repl, n)
		}
		missing = false
		total += n
	}
	if data == nil {
		data = []byte{}
	}
	return data, total, nil
}

// createEdited creates base in dir with content, for an edit with an empty
// old text on a missing file. A file created meanwhile is left alone.
func createEdited(dir int, base, rel string, content []byte, replacements int, maxFile int64) (agentproto.EditResult, error) {
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
	return agentproto.EditResult{Replacements: replacements, Size: int64(len(content)), Created: true}, nil
}

// errGrown is readAllFd's error for a file that grew past its limit.
var errGrown = errors.New("the file grew past the cap while it was read")

// readAllFd reads the file open as fd, expecting size bytes; one that has
// grown meanwhile is read to its end, but never past limit bytes (0: no
// limit): past it, readAllFd stops with errGrown. It stops with ctx's error
// when ctx ends.
func readAllFd(ctx context.Context, fd int, size, limit int64) ([]byte, error) {
	buf := make([]byte, 0, size+1)
	var off int64
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if limit > 0 && off > limit {
			return buf, errGrown
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		room := buf[len(buf):cap(buf)]
		if limit > 0 {
			room = room[:min(int64(len(room)), limit+1-off, agentproto.ChunkSize)]
		}
		n, err := pread(fd, room, off)
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
//
// The search compares at most about twice the bytes of data and old (a file
// of many equal lines against an old text of many lines would otherwise
// take lines × old lines comparisons), and stops when ctx ends; then it
// gives the general advice.
func nearMiss(ctx context.Context, data, old []byte) string {
	const fallback = "Read the file again (sandbox_read_file) and copy the text exactly, whitespace included."
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
		if i%4096 == 0 && ctx.Err() != nil {
			return fallback
		}
		flat[i] = squash(l)
	}
	want := make([]string, len(oldLines))
	for i, l := range oldLines {
		want[i] = squash(l)
	}
	// budget is what is left of the bytes the search may compare.
	budget := 2*int64(len(data)+len(old)) + 64<<10
	spend := func(a, b string) bool {
		budget -= int64(min(len(a), len(b))) + 1
		return budget >= 0
	}
	k := len(want)
	// matches reports whether old's lines match from line i on; first
	// tells whether its first line does.
	matches := func(i int) (match, first bool) {
		if k == 1 {
			budget -= int64(len(flat[i])) + 1
			return strings.Contains(flat[i], want[0]), false
		}
		spend(flat[i], want[0])
		if !strings.HasSuffix(flat[i], want[0]) {
			return false, false
		}
		if i+k > len(flat) || !spend(flat[i+k-1], want[k-1]) || !strings.HasPrefix(flat[i+k-1], want[k-1]) {
			return false, true
		}
		for j := 1; j < k-1; j++ {
			if !spend(flat[i+j], want[j]) || flat[i+j] != want[j] {
				return false, true
			}
		}
		return true, true
	}
	firstAt := -1
	for i := range flat {
		if budget < 0 || (i%4096 == 0 && ctx.Err() != nil) {
			break
		}
		match, first := matches(i)
		if match && budget >= 0 {
			where := fmt.Sprintf("line %d", i+1)
			if k > 1 {
				where = fmt.Sprintf("lines %d-%d", i+1, i+k)
			}
			return fmt.Sprintf("The nearest match is %s, which differs only in whitespace (indentation, tabs, spaces or line ends); line %d is exactly %s. Copy the text exactly as the file has it.",
				where, i+1, qname(lines[i]))
		}
		if firstAt < 0 && first {
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
