package workspace

// Restore: a tar stream into the workspace (tar in), staged beside the
// workspace's contents and swapped in whole, with the same fd-relative,
// no-follow primitives as the other operations (see the top of
// workspace.go). Extract, with its options, also unpacks a snapshot into a
// directory on the host (sandbox-mcp snapshot export).

import (
	"archive/tar"
	"errors"
	"io"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// Restore replaces the workspace's contents with the tar archive read from
// src, and reports the entries created, the bytes read and the entries
// skipped.
//
// The archive is extracted into a fresh staging directory inside the
// workspace (".sandbox-mcp-restore-<random>", mode 0700). Only when all of it
// extracted cleanly are the workspace's old contents moved aside and the
// staged entries moved into the root (renameat); the old contents are then
// deleted. On any error before that point the staging directory is removed
// and the workspace is left as it was. Other operations on this Workspace
// wait while the contents are swapped. Restoring needs room for the old and
// the new contents at once.
//
// Accepted entry types: regular files, directories, symlinks and hard links
// (PAX and GNU long-name headers are read by archive/tar; PAX global headers
// are ignored). Character and block devices and FIFOs are skipped (counted in
// Skipped), never created. Any other type is INVALID_ARGUMENT, as is an entry
// whose name is empty, absolute, has a ".." component or a NUL, or is longer
// than 4096 bytes; an entry whose parent path goes through a symlink (a
// symlink entry "link" -> /etc followed by "link/passwd" is refused: no path
// is ever resolved through a symlink while extracting); and a hard link whose
// target is not a regular file that came earlier in the archive. "./" name
// prefixes are accepted. Missing parent directories are created (0755).
//
// Symlinks are created as stored, whatever their target: inside the
// workspace they are only data, and every later operation resolves them with
// the confinement rules. Hard links are created with linkat (never following
// a symlink) to the earlier file. Only the permission bits are kept
// (setuid, setgid and sticky are dropped); ownership is not restored;
// modification times are. Directory modes and times are applied after their
// contents are in place. When a name occurs twice, the later entry replaces
// the earlier one, except that a directory and a non-directory may not
// replace each other (INVALID_ARGUMENT).
//
// Limits (0 = no limit for each): lim.MaxBytes bounds the bytes read from src
// (an entry's size is checked against what is left before it is written, so
// a "bomb" stops at the cap without filling the disk); lim.MaxEntries bounds
// the headers; lim.MaxDepth the components of an entry's name. Exceeding any
// is TOO_LARGE. After the end-of-archive marker, src is read to its end
// (within MaxBytes) and the rest is ignored.
func (w *Workspace) Restore(src io.Reader, lim agentproto.Limits) (agentproto.RestoreResult, error) {
	return w.Extract(src, lim, ExtractOptions{})
}

// ExtractOptions adjust Extract for a tree that is not a sandbox's own
// workspace, such as a directory on the host (sandbox-mcp snapshot export).
// The zero value extracts as Restore does.
type ExtractOptions struct {
	// ClearMode holds permission bits cleared from every file and
	// directory created, on top of setuid, setgid and sticky (e.g. the
	// umask, and group and other write).
	ClearMode uint32
	// KeepSymlink, if set, decides for each symlink entry, by its name and
	// target, whether it is created; one it refuses is skipped (counted in
	// Skipped) and nothing else changes.
	KeepSymlink func(name, target string) bool
}

// SymlinkStaysInside reports whether a symlink entry named name, whose
// target is target, leads to a place inside the tree it is extracted into,
// whatever the other entries are: the target is relative, and made only of
// ".." components followed only of other components, with no more ".."
// than name has parent directories. Every step up is then taken from the
// link's own directory (a real directory of the tree: entries are never
// placed through a symlink), and every step down stays inside, symlinks
// met on the way included, as each of those passed the same test. A target
// such as "a/../.." is refused, though it may be harmless, because "a"
// could itself be a symlink.
func SymlinkStaysInside(name, target string) bool {
	comps, problem := entryComps(name)
	if problem != "" || len(comps) == 0 || target == "" || strings.HasPrefix(target, "/") {
		return false
	}
	up, down := 0, false
	for c := range strings.SplitSeq(target, "/") {
		switch c {
		case "", ".":
		case "..":
			if down {
				return false
			}
			up++
		default:
			down = true
		}
	}
	return up <= len(comps)-1
}

// Extract is Restore with options (see ExtractOptions).
func (w *Workspace) Extract(src io.Reader, lim agentproto.Limits, opt ExtractOptions) (agentproto.RestoreResult, error) {
	const op = "restore"
	var res agentproto.RestoreResult
	if err := checkLimits(op, lim); err != nil {
		return res, err
	}
	w.restoreMu.Lock()
	defer w.restoreMu.Unlock()

	// Extraction uses a descriptor of its own, so that it needs no lock
	// while it waits for src.
	shared, err := w.enter()
	if err != nil {
		return res, err
	}
	root, err := unix.FcntlInt(uintptr(shared), unix.F_DUPFD_CLOEXEC, 0)
	w.mu.RUnlock()
	if err != nil {
		return res, fsError(op, ".", err)
	}
	defer closeFd(root)

	stagingName := randomName(restorePrefix)
	if err := unix.Mkdirat(root, stagingName, 0o700); err != nil {
		return res, fsError(op, ".", err)
	}
	staging, err := openat(root, stagingName, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		_ = unix.Unlinkat(root, stagingName, unix.AT_REMOVEDIR)
		return res, fsError(op, ".", err)
	}
	defer closeFd(staging)
	discard := func() {
		_ = removeTree(staging)
		_ = unix.Unlinkat(root, stagingName, unix.AT_REMOVEDIR)
	}

	x := &extractor{
		staging: staging,
		lim:     lim,
		opt:     opt,
		in:      &capReader{r: src, max: lim.MaxBytes},
		regular: map[string]bool{},
		dirs:    map[string]dirMeta{},
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	x.buf = *bp
	err = x.run()
	res = agentproto.RestoreResult{Files: x.files, Bytes: x.in.n, Skipped: x.skipped}
	if err != nil {
		discard()
		return res, unchanged(err)
	}

	w.mu.Lock()
	if w.fd < 0 {
		w.mu.Unlock()
		discard()
		return res, errClosed()
	}
	trash, trashName, err := swapIn(root, staging, stagingName)
	if err == nil {
		x.applyDirMeta(root)
	}
	w.mu.Unlock()
	if err != nil {
		discard()
		return res, unchanged(err)
	}

	// The old contents are out of sight (Snapshot skips the trash
	// directory); delete them without holding up other operations.
	err = removeTree(trash)
	closeFd(trash)
	if err == nil {
		err = unix.Unlinkat(root, trashName, unix.AT_REMOVEDIR)
	}
	if err != nil {
		return res, fault(
			"restore: the archive was restored, but the old contents could not all be deleted from %s (%v); delete that directory", quote(trashName), err)
	}
	return res, nil
}

// unchanged adds to a restore error that the workspace was not changed.
func unchanged(err error) error {
	const note = " (the workspace was left unchanged)"
	if e, ok := errcode.As(err); ok {
		return &errcode.Error{Code: e.Code, Message: e.Message + note}
	}
	var f *faultError
	if errors.As(err, &f) {
		return &faultError{msg: f.msg + note}
	}
	return err // the caller's own error from src
}

// swapIn moves the root's entries (other than the staging directory) into a
// new trash directory and the staged entries into the root. On failure it
// moves everything back and returns an error; on success it returns the
// trash directory, open for reading, and its name.
func swapIn(root, staging int, stagingName string) (int, string, error) {
	const op = "restore"
	rootDir, err := openat(root, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", fsError(op, ".", err)
	}
	old, err := readNames(rootDir)
	closeFd(rootDir)
	if err != nil {
		return -1, "", fsError(op, ".", err)
	}
	trashName := randomName(trashPrefix)
	if err := unix.Mkdirat(root, trashName, 0o700); err != nil {
		return -1, "", fsError(op, ".", err)
	}
	trash, err := openat(root, trashName, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		_ = unix.Unlinkat(root, trashName, unix.AT_REMOVEDIR)
		return -1, "", fsError(op, ".", err)
	}

	type movedOut struct {
		name        string
		restoreMode bool   // the mode had to be changed to move it
		mode        uint32 // the original mode
	}
	var out []movedOut
	var in []string
	undo := func() {
		for _, name := range slices.Backward(in) {
			_ = unix.Renameat(root, name, staging, name)
		}
		for _, m := range slices.Backward(out) {
			if unix.Renameat(trash, m.name, root, m.name) == nil && m.restoreMode {
				if fd, err := openat(root, m.name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY, 0); err == nil {
					_ = chmodPathFd(fd, m.mode)
					closeFd(fd)
				}
			}
		}
		_ = removeTree(trash)
		closeFd(trash)
		_ = unix.Unlinkat(root, trashName, unix.AT_REMOVEDIR)
	}

	for _, name := range old {
		if name == stagingName || name == trashName {
			continue
		}
		m := movedOut{name: name}
		err := unix.Renameat(root, name, trash, name)
		if err == unix.EACCES || err == unix.EPERM {
			// A directory can only move to another parent when it is
			// writable (its ".." entry changes).
			if fd, oerr := openat(root, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY, 0); oerr == nil {
				if st, serr := fstat(fd); serr == nil && chmodPathFd(fd, permBits(st.Mode)|0o700) == nil {
					m.restoreMode, m.mode = true, permBits(st.Mode)
				}
				closeFd(fd)
			}
			err = unix.Renameat(root, name, trash, name)
		}
		if err == unix.ENOENT {
			continue
		}
		if err != nil {
			undo()
			return -1, "", fsError(op, name, err)
		}
		out = append(out, m)
	}

	if _, err := unix.Seek(staging, 0, io.SeekStart); err != nil {
		undo()
		return -1, "", fsError(op, ".", err)
	}
	staged, err := readNames(staging)
	if err != nil {
		undo()
		return -1, "", fsError(op, ".", err)
	}
	for _, name := range staged {
		err := unix.Renameat2(staging, name, root, name, unix.RENAME_NOREPLACE)
		if err == unix.EINVAL {
			err = unix.Renameat(staging, name, root, name) // no RENAME_NOREPLACE here
		}
		if err == unix.EEXIST {
			undo()
			return -1, "", errcode.Errorf(errcode.Busy,
				"restore: %s was created in the workspace while the restore was running; retry when nothing else writes to the workspace", quote(name))
		}
		if err != nil {
			undo()
			return -1, "", fsError(op, name, err)
		}
		in = append(in, name)
	}
	if err := unix.Unlinkat(root, stagingName, unix.AT_REMOVEDIR); err != nil {
		// Something was added to the staging directory meanwhile.
		_ = removeTree(staging)
		_ = unix.Unlinkat(root, stagingName, unix.AT_REMOVEDIR)
	}
	return trash, trashName, nil
}

// dirMeta is a directory's mode and time from the archive, applied after
// its contents are in place.
type dirMeta struct {
	mode  uint32
	mtime time.Time
}

// extractor carries one Restore call's state.
type extractor struct {
	staging int // the staging directory, open for reading
	lim     agentproto.Limits
	opt     ExtractOptions
	in      *capReader
	buf     []byte

	headers, files, skipped int
	regular                 map[string]bool    // regular files extracted so far: hard-link targets
	dirs                    map[string]dirMeta // directory entries
}

// capReader counts what is read from the archive stream and enforces the
// byte limit.
type capReader struct {
	r   io.Reader
	n   int64 // bytes read
	max int64 // 0: no limit
	err error // sticky: TOO_LARGE, or the caller's error (dstError)
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.max > 0 {
		left := c.max - c.n
		if left <= 0 {
			// At the limit: only the end of the stream may follow.
			var one [1]byte
			n, err := c.r.Read(one[:])
			switch {
			case n > 0:
				c.err = c.tooLarge()
				return 0, c.err
			case err == io.EOF:
				return 0, io.EOF
			case err != nil:
				c.err = dstError{err}
				return 0, c.err
			}
			return 0, nil
		}
		if int64(len(p)) > left {
			p = p[:left]
		}
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF {
		c.err = dstError{err}
		return n, c.err
	}
	return n, err
}

func (c *capReader) tooLarge() error {
	return errcode.Errorf(errcode.TooLarge,
		"restore: the archive is larger than %d bytes, the limit set by the server; restore a smaller snapshot", c.max)
}

// run extracts the whole archive into the staging directory.
func (x *extractor) run() error {
	tr := tar.NewReader(x.in)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if errors.Is(err, tar.ErrInsecurePath) && hdr != nil {
			err = nil // GODEBUG tarinsecurepath=0: entry() applies its own, stricter checks
		}
		if err != nil {
			return x.streamErr(err)
		}
		x.headers++
		if x.lim.MaxEntries > 0 && x.headers > x.lim.MaxEntries {
			return errcode.Errorf(errcode.TooLarge,
				"restore: the archive has more than %d entries, the limit set by the server; restore a smaller snapshot", x.lim.MaxEntries)
		}
		if err := x.entry(tr, hdr); err != nil {
			return err
		}
	}
	// Read the rest (tar writers pad to whole records) so that the stream
	// ends cleanly.
	if _, err := io.Copy(io.Discard, x.in); err != nil {
		return x.streamErr(err)
	}
	return nil
}

// streamErr explains a failure to read the archive.
func (x *extractor) streamErr(err error) error {
	if x.in.err != nil {
		err = x.in.err
	}
	var de dstError
	if errors.As(err, &de) {
		return de.err
	}
	if d, ok := described(err); ok {
		return d
	}
	return errcode.Errorf(errcode.InvalidArgument,
		"restore: the archive is not a valid tar stream (%v); restore from a snapshot made by this server", err)
}

// bad is an INVALID_ARGUMENT error about one archive entry.
func bad(name, format string, args ...any) error {
	return errcode.Errorf(errcode.InvalidArgument, "restore: entry %s "+format, append([]any{qname(name)}, args...)...)
}

// entryComps validates an archive name and returns its components ("" and
// "." components dropped). problem is "" when the name is acceptable.
func entryComps(name string) (comps []string, problem string) {
	switch {
	case name == "":
		return nil, "has an empty name"
	case strings.IndexByte(name, 0) >= 0:
		return nil, "contains a NUL byte"
	case len(name) > maxPathLen:
		return nil, "is longer than 4096 bytes"
	case strings.HasPrefix(name, "/"):
		return nil, "is an absolute path; archive names must be relative to the workspace"
	}
	for c := range strings.SplitSeq(name, "/") {
		switch c {
		case "", ".":
		case "..":
			return nil, `has a ".." component, which could leave the workspace`
		default:
			comps = append(comps, c)
		}
	}
	return comps, ""
}

// entry extracts one archive entry.
func (x *extractor) entry(tr *tar.Reader, hdr *tar.Header) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	comps, problem := entryComps(hdr.Name)
	if problem != "" {
		return bad(hdr.Name, "%s", problem)
	}
	if len(comps) == 0 {
		if hdr.Typeflag == tar.TypeDir {
			return nil // the root itself ("./"): nothing to create
		}
		return bad(hdr.Name, "names the workspace root, which can only be a directory")
	}
	if x.lim.MaxDepth > 0 && len(comps) > x.lim.MaxDepth {
		return errcode.Errorf(errcode.TooLarge,
			"restore: entry %s is %d levels deep, more than the limit of %d set by the server", qname(hdr.Name), len(comps), x.lim.MaxDepth)
	}
	switch hdr.Typeflag {
	case tar.TypeReg, 0: // 0 is the old TypeRegA
		return x.regularFile(tr, hdr, comps)
	case tar.TypeDir:
		return x.directory(hdr, comps)
	case tar.TypeSymlink:
		return x.symlink(hdr, comps)
	case tar.TypeLink:
		return x.hardlink(hdr, comps)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		x.skipped++
		return nil
	}
	return bad(hdr.Name, "has tar type %q, which a restore does not accept (only files, directories, symlinks and hard links)", string(rune(hdr.Typeflag)))
}

// parent resolves (creating as needed) the parent directory of an entry in
// the staging directory, refusing any symlink on the way.
func (x *extractor) parent(name string, comps []string) (int, error) {
	fd, err := mkdirParents(x.staging, comps[:len(comps)-1], resolveNoSymlinks, "restore", name)
	if err != nil {
		return -1, x.fail(name, err)
	}
	return fd, nil
}

// fail maps a system call failure while extracting the entry name.
func (x *extractor) fail(name string, err error) error {
	switch err {
	case unix.ELOOP:
		return bad(name, "lies below a symlink that came earlier in the archive; an archive may not place entries through a symlink")
	case unix.ENOTDIR:
		return bad(name, "lies below an entry that is not a directory")
	case unix.ENOSPC, unix.EDQUOT, unix.EFBIG:
		return errcode.Errorf(errcode.TooLarge,
			"restore: the workspace ran out of space while extracting %s; a restore needs room for the old and the new contents at once: delete files first, or restore into a new session", qname(name))
	}
	return fsError("restore: entry", name, err)
}

// place runs create, which makes base in dir; if base exists already (the
// name came earlier in the archive) and is not a directory, it is removed
// and create runs again.
func (x *extractor) place(dir int, base, name string, create func() error) error {
	err := create()
	if err != unix.EEXIST {
		return err
	}
	if st, serr := lstatAt(dir, base); serr == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return bad(name, "has the name of a directory that came earlier in the archive")
	}
	if err := unix.Unlinkat(dir, base, 0); err != nil && err != unix.ENOENT {
		return err
	}
	return create()
}

func (x *extractor) regularFile(tr *tar.Reader, hdr *tar.Header, comps []string) error {
	name := hdr.Name
	size := hdr.Size
	if size < 0 {
		return bad(name, "has a negative size")
	}
	if x.lim.MaxBytes > 0 && x.in.n+padded(size) > x.lim.MaxBytes {
		return errcode.Errorf(errcode.TooLarge,
			"restore: entry %s is %d bytes, more than is left of the %d-byte limit set by the server; restore a smaller snapshot", qname(name), size, x.lim.MaxBytes)
	}
	dir, err := x.parent(name, comps)
	if err != nil {
		return err
	}
	defer closeFd(dir)
	base := comps[len(comps)-1]
	fd := -1
	err = x.place(dir, base, name, func() error {
		var e error
		fd, e = openat(dir, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, 0o600)
		return e
	})
	if err != nil {
		return x.fail(name, err)
	}
	defer closeFd(fd)
	for {
		n, rerr := tr.Read(x.buf)
		if n > 0 {
			if err := writeAll(fd, x.buf[:n]); err != nil {
				return x.fail(name, err)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return x.streamErr(rerr)
		}
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode)&0o777&^x.opt.ClearMode); err != nil {
		return x.fail(name, err)
	}
	_ = futimens(fd, hdr.ModTime)
	x.regular[strings.Join(comps, "/")] = true
	x.files++
	return nil
}

func (x *extractor) directory(hdr *tar.Header, comps []string) error {
	name := hdr.Name
	dir, err := x.parent(name, comps)
	if err != nil {
		return err
	}
	defer closeFd(dir)
	base := comps[len(comps)-1]
	// 0700 until the end: the directory's own mode may forbid adding its
	// contents.
	if err := unix.Mkdirat(dir, base, 0o700); err == unix.EEXIST {
		if st, serr := lstatAt(dir, base); serr != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return bad(name, "is a directory, but the same name came earlier in the archive as a file or symlink")
		}
	} else if err != nil {
		return x.fail(name, err)
	}
	key := strings.Join(comps, "/")
	x.dirs[key] = dirMeta{mode: uint32(hdr.Mode) & 0o777 &^ x.opt.ClearMode, mtime: hdr.ModTime}
	delete(x.regular, key)
	x.files++
	return nil
}

func (x *extractor) symlink(hdr *tar.Header, comps []string) error {
	name := hdr.Name
	if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 {
		return bad(name, "is a symlink with an empty target or a target that contains NUL")
	}
	if x.opt.KeepSymlink != nil && !x.opt.KeepSymlink(name, hdr.Linkname) {
		x.skipped++
		return nil
	}
	dir, err := x.parent(name, comps)
	if err != nil {
		return err
	}
	defer closeFd(dir)
	base := comps[len(comps)-1]
	if err := x.place(dir, base, name, func() error { return unix.Symlinkat(hdr.Linkname, dir, base) }); err != nil {
		return x.fail(name, err)
	}
	ts := unix.Timespec{Sec: hdr.ModTime.Unix(), Nsec: int64(hdr.ModTime.Nanosecond())}
	_ = unix.UtimesNanoAt(dir, base, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
	delete(x.regular, strings.Join(comps, "/"))
	x.files++
	return nil
}

func (x *extractor) hardlink(hdr *tar.Header, comps []string) error {
	name := hdr.Name
	tcomps, problem := entryComps(hdr.Linkname)
	if problem != "" {
		return bad(name, "is a hard link to %s, which %s", qname(hdr.Linkname), problem)
	}
	key, tkey := strings.Join(comps, "/"), strings.Join(tcomps, "/")
	if len(tcomps) == 0 || !x.regular[tkey] {
		return bad(name, "is a hard link to %s, which is not a regular file that came earlier in the archive", qname(hdr.Linkname))
	}
	if key == tkey {
		x.files++
		return nil // a link to itself: nothing to do
	}
	tdirPath := "."
	if len(tcomps) > 1 {
		tdirPath = strings.Join(tcomps[:len(tcomps)-1], "/")
	}
	tdir, err := openBeneath(x.staging, tdirPath, unix.O_PATH|unix.O_DIRECTORY, resolveNoSymlinks)
	if err != nil {
		return x.fail(name, err)
	}
	defer closeFd(tdir)
	tbase := tcomps[len(tcomps)-1]
	if st, err := lstatAt(tdir, tbase); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return bad(name, "is a hard link to %s, which is no longer a regular file", qname(hdr.Linkname))
	}
	dir, err := x.parent(name, comps)
	if err != nil {
		return err
	}
	defer closeFd(dir)
	base := comps[len(comps)-1]
	// linkat without AT_SYMLINK_FOLLOW links the name itself, never what a
	// symlink would point to.
	if err := x.place(dir, base, name, func() error { return unix.Linkat(tdir, tbase, dir, base, 0) }); err != nil {
		return x.fail(name, err)
	}
	x.regular[key] = true
	x.files++
	return nil
}

// applyDirMeta gives the restored directories their modes and times, deepest
// first, once everything is in place in the root. Best effort: a directory
// that is gone or replaced meanwhile is passed over.
func (x *extractor) applyDirMeta(root int) {
	paths := make([]string, 0, len(x.dirs))
	for p := range x.dirs {
		paths = append(paths, p)
	}
	slices.SortFunc(paths, func(a, b string) int {
		return strings.Count(b, "/") - strings.Count(a, "/")
	})
	for _, p := range paths {
		fd, err := openBeneath(root, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, resolveNoSymlinks)
		if err != nil {
			continue
		}
		m := x.dirs[p]
		_ = futimens(fd, m.mtime)
		_ = unix.Fchmod(fd, m.mode)
		closeFd(fd)
	}
}
