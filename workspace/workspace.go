// Confined file operations on the sandbox workspace.
//
// # Confinement model
//
// The agent runs as the same unprivileged user as the sandboxed code, which
// can create, rename and swap any file in the workspace at any moment, also
// while an operation is in flight. A Workspace therefore never acts on a path
// string that something else could change between a check and a use:
//
//   - Open opens the workspace directory once (O_PATH|O_DIRECTORY).
//     Every later system call is relative to that descriptor or to a
//     descriptor derived from it.
//   - Multi-component paths are resolved by the kernel with openat2 and
//     RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS|RESOLVE_NO_XDEV: absolute paths,
//     ".." above the root, absolute symlinks, relative symlinks that climb
//     out, /proc magic links and mount crossings all fail inside the one
//     system call that opens the file. Symlinks that stay inside are followed
//     (a read of "link-to-dir/x" works); the check and the use are the same
//     call, so a symlink swapped in concurrently can at worst redirect a call
//     to another file inside the workspace, never outside it.
//   - Single names (a write's last component, names read from a directory)
//     are used with *at calls on an already-resolved directory descriptor,
//     with O_NOFOLLOW / AT_SYMLINK_NOFOLLOW: writes replace a symlink with a
//     regular file (temporary file + renameat) and never write through it;
//     List, Snapshot and Restore never follow one.
//   - Delete and Move change names, so they resolve the directory holding
//     the name with RESOLVE_NO_SYMLINKS as well (any symlink on the path is
//     refused, even one that stays inside) and act with unlinkat and
//     renameat2 on that descriptor: a symlink is removed or renamed itself,
//     never its target, and a recursive delete never follows one.
//   - Opens that could block (a FIFO) use O_NONBLOCK, and only regular files
//     (fstat S_ISREG on the opened descriptor) are read or written.
//
// Limits of the model, stated plainly:
//
//   - Hard links are not refused (a file with st_nlink > 1 is read and
//     written like any other). In the container the workspace is its own
//     tmpfs, and link(2) cannot cross file systems (EXDEV), so a hard link in
//     the workspace can only point at another workspace file. On a host where
//     the workspace shares a file system with other files (tests), a hard
//     link made there by someone else would be followed.
//   - Bind mounts are not expected in the workspace (the sandbox cannot mount
//     anything: no CAP_SYS_ADMIN). Should one exist, RESOLVE_NO_XDEV refuses
//     to cross it on any path, and the walks (List, Snapshot, Restore's
//     removal of the old contents) do not descend into it.
//   - Confinement is about where operations land, not about contention: the
//     sandboxed code can still make an operation fail (by deleting or
//     swapping files, filling the tmpfs, or creating huge directories).
//   - Names are bytes. List renders names that are not valid UTF-8 with
//     U+FFFD (strings.ToValidUTF8), so such a listed path cannot be passed
//     back verbatim (rename the file through exec); error messages quote
//     names Go-style (\xff).

package workspace

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// Workspace confines file operations to the tree under one directory. Safe
// for concurrent use.
//
// Paths given to its methods are workspace-relative and "/"-separated; "" and
// "." name the root. A path containing NUL, longer than 4096 bytes, or
// starting with "/" is refused before any system call (OUTSIDE_WORKSPACE for
// an absolute path: the caller maps "/workspace/x" to "x" if it wants that
// alias). ".." is allowed while it stays inside ("sub/../ok.txt"). See the
// comment at the top of this file for the confinement model and its limits.
//
// Every failure the caller can act on is an *errcode.Error whose message
// names the path, says what was wrong and what to do instead. A fault it
// cannot act on (an unexpected errno, say) is an error of another type with
// the same kind of message, and the agent sends it as INTERNAL. An error
// returned by the caller's own reader, writer or callback (src, dst, emit)
// is returned unchanged, so the caller can recognise its own cancellation.
//
// Names starting with ".sandbox-mcp-" are reserved for the agent's temporary
// files (see WriteFile and Restore).
type Workspace struct {
	// mu is held shared by every operation and exclusively by Close and by
	// the step of Restore that swaps the old contents for the new.
	mu sync.RWMutex
	fd int // O_PATH|O_DIRECTORY descriptor of the root; -1 once closed

	// restoreMu serialises Restore calls.
	restoreMu sync.Mutex
}

// Open opens dir once (O_PATH|O_DIRECTORY); all later operations are
// relative to that descriptor, so renaming or replacing dir afterwards does
// not move the workspace. It fails when openat2 is unavailable (Linux before
// 5.6, or a seccomp profile that refuses it), since confinement depends on it.
func Open(dir string) (*Workspace, error) {
	if dir == "" {
		return nil, errcode.Errorf(errcode.InvalidArgument, "open workspace: no directory given")
	}
	var fd int
	var err error
	for {
		fd, err = unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, errcode.Errorf(errcode.NotFound, "open workspace %q: %w", dir, err)
		}
		return nil, fault("open workspace %q: %v", dir, err)
	}
	probe, err := openBeneath(fd, ".", unix.O_PATH|unix.O_DIRECTORY, resolveFlags)
	if err != nil {
		closeFd(fd)
		return nil, fault(
			"open workspace %q: openat2 failed (%v); the agent needs Linux 5.6 or later and a seccomp profile that allows openat2", dir, err)
	}
	closeFd(probe)
	return &Workspace{fd: fd}, nil
}

// Close releases the workspace descriptor. It waits for operations in flight;
// later calls fail with UNAVAILABLE.
func (w *Workspace) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd < 0 {
		return nil
	}
	err := unix.Close(w.fd)
	w.fd = -1
	if err != nil {
		return fault("close workspace: %v", err)
	}
	return nil
}

// enter takes the shared lock and returns the root descriptor. The caller
// calls w.mu.RUnlock when done.
func (w *Workspace) enter() (int, error) {
	w.mu.RLock()
	if w.fd < 0 {
		w.mu.RUnlock()
		return -1, errClosed()
	}
	return w.fd, nil
}

func errClosed() error {
	return errcode.Errorf(errcode.Unavailable, "the workspace is closed (the sandbox is shutting down); start a new session")
}

// ReadFile writes part of the regular file rel to dst, in Write calls of at
// most agentproto.ChunkSize bytes. It reads from offset, length bytes (0: to
// the end of the file), and sends at most max bytes (0 sends nothing).
// Symlinks inside the workspace are followed. A FIFO, socket or device is
// refused at once, without blocking. The result's Size is the file's size
// when it was opened; Truncated is set when fewer bytes were sent than asked
// for (the max cap, or a file that shrank meanwhile). A file that grows while
// it is read is never read beyond the cap. When ctx ends the read stops and
// fails with TIMEOUT.
func (w *Workspace) ReadFile(ctx context.Context, rel string, offset, length, max int64, dst io.Writer) (agentproto.ReadResult, error) {
	const op = "read"
	var res agentproto.ReadResult
	p, err := parsePath(op, rel)
	if err != nil {
		return res, err
	}
	if offset < 0 || length < 0 || max < 0 {
		return res, errcode.Errorf(errcode.InvalidArgument,
			"read %s: offset, length and max must not be negative (got %d, %d, %d)", quote(rel), offset, length, max)
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
	res.Size = st.Size
	res.Offset = offset
	if offset > st.Size {
		return res, errcode.Errorf(errcode.InvalidArgument,
			"read %s: offset %d is past the end of the file (%d bytes); use an offset of at most %d", quote(rel), offset, st.Size, st.Size)
	}
	want := st.Size - offset
	if length > 0 && length < want {
		want = length
	}
	sent, err := sendRange(ctx, fd, offset, min(want, max), dst)
	if err != nil {
		return res, readErr(ctx, op, rel, err)
	}
	res.Truncated = sent < want
	res.End = offset + sent
	return res, nil
}

// openRegular opens a file with open, which passes O_NONBLOCK so that a
// FIFO does not wait for a writer, and keeps it only if it is a regular
// file: it returns the descriptor, O_NONBLOCK cleared, and its stat. An
// errno from open comes back as it is (a unix.Errno), for the caller to
// word (a missing file, a symlink); a file that is not regular is closed and
// refused with an *irregular (notRegular's message; st says what it is);
// other errors are worded for op and rel. Reading, editing, appending and
// snapshots open files through it.
func openRegular(open func() (int, error), op, rel string) (int, unix.Stat_t, error) {
	fd, err := open()
	if err != nil {
		if _, ok := err.(unix.Errno); !ok {
			err = fsError(op, rel, err)
		}
		return -1, unix.Stat_t{}, err
	}
	st, err := fstat(fd)
	if err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
		closeFd(fd)
		return -1, st, &irregular{mode: st.Mode, err: notRegular(op, rel, st.Mode)}
	}
	if err == nil {
		err = clearNonblock(fd)
	}
	if err != nil {
		closeFd(fd)
		return -1, st, fsError(op, rel, err)
	}
	return fd, st, nil
}

// irregular is openRegular's refusal of a file that is not a regular file.
type irregular struct {
	mode uint32
	err  error // what the model is told
}

func (e *irregular) Error() string { return e.err.Error() }
func (e *irregular) Unwrap() error { return e.err }

// openRegularPath opens the regular file p for reading, following symlinks
// that stay inside the workspace, and returns it with its stat. A FIFO,
// socket or device is refused without blocking.
func openRegularPath(root int, p wsPath, op, rel string) (int, unix.Stat_t, error) {
	fd, st, err := openRegular(func() (int, error) {
		return openBeneath(root, p.open(), unix.O_RDONLY|unix.O_NONBLOCK, resolveFlags)
	}, op, rel)
	if errno, ok := err.(unix.Errno); ok {
		err = fsError(op, rel, errno)
	}
	return fd, st, err
}

// dstError carries an error from the caller's writer (or reader) through the
// internal layers, so it can be returned unchanged.
type dstError struct{ err error }

func (e dstError) Error() string { return e.err.Error() }

// sendRange writes up to n bytes of fd from offset to dst with pread, in
// Writes of at most ChunkSize bytes. It stops early at end of file, and
// with ctx's error when ctx ends.
func sendRange(ctx context.Context, fd int, offset, n int64, dst io.Writer) (int64, error) {
	if n <= 0 {
		return 0, nil
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var sent int64
	for sent < n {
		if err := ctx.Err(); err != nil {
			return sent, err
		}
		chunk := buf[:min(int64(len(buf)), n-sent)]
		k, err := unix.Pread(fd, chunk, offset+sent)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return sent, err
		}
		if k == 0 {
			break // the file shrank
		}
		if _, err := dst.Write(chunk[:k]); err != nil {
			return sent, dstError{err}
		}
		sent += int64(k)
	}
	return sent, nil
}

// WriteFile writes exactly size bytes from src to the regular file rel and
// reports the bytes written and the file's size afterwards. Missing parent
// directories are created (mode 0755, one at a time, never through a
// symlink); a parent that is a file is INVALID_ARGUMENT.
//
// Without append, the content goes to a temporary file
// (".sandbox-mcp-tmp-<random>") in the parent directory, which gets the mode
// mode&0777 and is then renamed over rel: readers see the old or the new
// content, never a mix; concurrent writers leave exactly one of their
// contents; a symlink at rel is replaced by the file, never followed; an
// existing file's hard links and mode are not kept (the file is a new one
// with mode). If src ends before size bytes or has more, nothing changes and
// the temporary file is removed.
//
// With append, the content is appended to rel (created with mode&0777 if
// missing). It is collected first (in memory up to ChunkSize, otherwise in an
// unnamed temporary file), so a short, long or cancelled input leaves rel
// untouched. rel must be a regular file; a symlink is refused.
//
// The caller supplies the mode (the tool default is 0644); setuid, setgid and
// sticky bits are dropped.
func (w *Workspace) WriteFile(rel string, src io.Reader, size int64, append bool, mode uint32) (agentproto.WriteResult, error) {
	op := "write"
	if append {
		op = "append to"
	}
	var res agentproto.WriteResult
	p, err := parsePath(op, rel)
	if err != nil {
		return res, err
	}
	switch {
	case len(p.comps) == 0:
		return res, errcode.Errorf(errcode.InvalidArgument,
			`%s %s: that is the workspace root directory; give a file path such as "notes.txt"`, op, quote(rel))
	case p.dirOnly:
		return res, errcode.Errorf(errcode.InvalidArgument,
			`%s %s: the path ends in "/", "." or "..", so it names a directory; give a file name, without a trailing "/"`, op, quote(rel))
	case size < 0:
		return res, errcode.Errorf(errcode.InvalidArgument, "%s %s: negative size %d", op, quote(rel), size)
	}
	perm := mode & 0o777
	base := p.comps[len(p.comps)-1]

	root, err := w.enter()
	if err != nil {
		return res, err
	}
	defer w.mu.RUnlock()

	dir, err := mkdirParents(root, p.comps[:len(p.comps)-1], resolveFlags, op, rel)
	if err != nil {
		return res, fsError(op, rel, err)
	}
	defer closeFd(dir)
	if append {
		return appendFile(dir, base, op, rel, src, size, perm)
	}
	return replaceFile(dir, base, op, rel, src, size, perm)
}

// createTemp makes a new file of a random name in dir, private to the
// agent until it is renamed into place.
func createTemp(dir int) (name string, fd int, err error) {
	for range 100 {
		name = randomName(tmpPrefix)
		fd, err = openat(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, 0o600)
		if err != unix.EEXIST {
			break
		}
	}
	return name, fd, err
}

// replaceFile is WriteFile without append; dir is the resolved parent.
func replaceFile(dir int, base, op, rel string, src io.Reader, size int64, perm uint32) (agentproto.WriteResult, error) {
	var res agentproto.WriteResult
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

	if err := copyExact(op, rel, src, size, func(b []byte) error { return writeAll(fd, b) }); err != nil {
		return res, unwrapDst(op, rel, err)
	}
	if err := unix.Fchmod(fd, perm); err != nil {
		return res, fsError(op, rel, err)
	}
	st, err := fstat(fd)
	if err != nil {
		return res, fsError(op, rel, err)
	}
	if err := unix.Renameat(dir, tmp, dir, base); err != nil {
		return res, fsError(op, rel, err)
	}
	done = true
	return agentproto.WriteResult{Written: size, Size: st.Size}, nil
}

// copyExact copies exactly size bytes from src to write. Errors of src are
// wrapped in dstError; too few or too many bytes are INVALID_ARGUMENT.
func copyExact(op, rel string, src io.Reader, size int64, write func([]byte) error) error {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var got int64
	for got < size {
		n, err := src.Read(buf[:min(int64(len(buf)), size-got)])
		if n > 0 {
			if werr := write(buf[:n]); werr != nil {
				return werr
			}
			got += int64(n)
		}
		if err == io.EOF {
			if got < size {
				return errcode.Errorf(errcode.InvalidArgument,
					"%s %s: the content ended after %d of the %d bytes announced; the file was not changed, send the whole content again", op, quote(rel), got, size)
			}
			return nil
		}
		if err != nil {
			return dstError{err}
		}
	}
	// Expect end of input now: a byte more means the size was wrong.
	for range 100 {
		n, err := src.Read(buf[:1])
		if n > 0 {
			return errcode.Errorf(errcode.InvalidArgument,
				"%s %s: more than the %d bytes announced arrived; the file was not changed, send the content with its exact size", op, quote(rel), size)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return dstError{err}
		}
	}
	return fault("%s %s: the content stream returned no data and no end", op, quote(rel))
}

// unwrapDst returns a caller's error unchanged and maps the others.
func unwrapDst(op, rel string, err error) error {
	if de, ok := err.(dstError); ok {
		return de.err
	}
	return fsError(op, rel, err)
}

// appendFile is WriteFile with append; dir is the resolved parent.
func appendFile(dir int, base, op, rel string, src io.Reader, size int64, perm uint32) (agentproto.WriteResult, error) {
	var res agentproto.WriteResult

	// Collect the input first, so that a bad or cancelled stream leaves the
	// target untouched.
	var data io.ReaderAt
	if size <= agentproto.ChunkSize {
		var b bytes.Buffer
		b.Grow(int(size))
		if err := copyExact(op, rel, src, size, func(p []byte) error { b.Write(p); return nil }); err != nil {
			return res, unwrapDst(op, rel, err)
		}
		data = bytes.NewReader(b.Bytes())
	} else {
		spool, err := unnamedTemp(dir)
		if err != nil {
			return res, fsError(op, rel, err)
		}
		defer closeFd(spool)
		if err := copyExact(op, rel, src, size, func(p []byte) error { return writeAll(spool, p) }); err != nil {
			return res, unwrapDst(op, rel, err)
		}
		data = fdReaderAt(spool)
	}

	var created bool
	fd, st, err := openRegular(func() (fd int, err error) {
		fd, created, err = openAppend(dir, base)
		return fd, err
	}, op, rel)
	if err == unix.ELOOP {
		if st, serr := lstatAt(dir, base); serr == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return res, errcode.Errorf(errcode.InvalidArgument,
				"append to %s: it is a symlink; append to its target instead (list shows the target)", quote(rel))
		}
	}
	if errno, ok := err.(unix.Errno); ok {
		return res, fsError(op, rel, errno)
	}
	if err != nil {
		return res, err
	}
	defer closeFd(fd)
	if created {
		if err := unix.Fchmod(fd, perm); err != nil {
			return res, fsError(op, rel, err)
		}
	}

	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var done int64
	for done < size {
		n, err := data.ReadAt(buf[:min(int64(len(buf)), size-done)], done)
		if n > 0 {
			if werr := writeAll(fd, buf[:n]); werr != nil {
				err = werr
			} else {
				done += int64(n)
			}
		}
		if err != nil && !(err == io.EOF && done == size) {
			undoAppend(dir, base, fd, created, st.Size, done)
			return res, fsError(op, rel, err)
		}
	}
	after, err := fstat(fd)
	if err != nil {
		return res, fsError(op, rel, err)
	}
	return agentproto.WriteResult{Written: size, Size: after.Size}, nil
}

// openAppend opens base in dir for appending, creating it if missing, never
// following a symlink and never blocking. created tells whether this call
// created the file.
func openAppend(dir int, base string) (fd int, created bool, err error) {
	const flags = unix.O_WRONLY | unix.O_APPEND | unix.O_NOFOLLOW | unix.O_NONBLOCK
	for range 10 {
		fd, err = openat(dir, base, flags|unix.O_CREAT|unix.O_EXCL, 0o600)
		if err == nil {
			return fd, true, nil
		}
		if err != unix.EEXIST {
			return -1, false, err
		}
		fd, err = openat(dir, base, flags, 0)
		if err != unix.ENOENT { // ENOENT: removed in between; try again
			return fd, false, err
		}
	}
	return -1, false, err
}

// undoAppend removes what a failed append wrote: the file if this call
// created it, otherwise the appended tail, as long as nothing else has
// appended meanwhile. Best effort.
func undoAppend(dir int, base string, fd int, created bool, before, appended int64) {
	st, err := fstat(fd)
	if err != nil {
		return
	}
	if created {
		if cur, err := lstatAt(dir, base); err == nil && cur.Dev == st.Dev && cur.Ino == st.Ino {
			_ = unix.Unlinkat(dir, base, 0)
		}
		return
	}
	if st.Size == before+appended {
		_ = unix.Ftruncate(fd, before)
	}
}

// unnamedTemp opens an unnamed temporary file in dir (O_TMPFILE), or a named
// one that is unlinked at once where O_TMPFILE is unsupported.
func unnamedTemp(dir int) (int, error) {
	fd, err := openat(dir, ".", unix.O_TMPFILE|unix.O_RDWR, 0o600)
	if err == nil || (err != unix.EOPNOTSUPP && err != unix.EISDIR && err != unix.EINVAL) {
		return fd, err
	}
	name := randomName(tmpPrefix)
	fd, err = openat(dir, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return -1, err
	}
	_ = unix.Unlinkat(dir, name, 0)
	return fd, nil
}

// fdReaderAt reads a descriptor with pread.
type fdReaderAt int

func (f fdReaderAt) ReadAt(p []byte, off int64) (int, error) {
	for {
		n, err := unix.Pread(int(f), p, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 && len(p) > 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

// OpenDir returns a descriptor of the directory rel (O_PATH|O_DIRECTORY),
// resolved like every other path, for use as a command's working directory
// (fchdir, or /proc/self/fd/N). Symlinks inside the workspace are followed.
// The file's Name is the normalised workspace-relative path, for messages
// only: resolving it again as a path would undo the confinement. The caller
// closes it.
func (w *Workspace) OpenDir(rel string) (*os.File, error) {
	const op = "cwd"
	p, err := parsePath(op, rel)
	if err != nil {
		return nil, err
	}
	root, err := w.enter()
	if err != nil {
		return nil, err
	}
	defer w.mu.RUnlock()
	fd, err := openBeneath(root, p.open(), unix.O_PATH|unix.O_DIRECTORY, resolveFlags)
	if err == unix.ENOTDIR {
		return nil, errcode.Errorf(errcode.InvalidArgument,
			`cwd %s is not a directory; use a directory inside the workspace ("." for the root)`, quote(rel))
	}
	if err != nil {
		return nil, fsError(op, rel, err)
	}
	return os.NewFile(uintptr(fd), p.String()), nil
}
