package workspace

import (
	"golang.org/x/sys/unix"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// Delete and Move change names, not contents, so they never follow a
// symlink anywhere: the directory holding the name is resolved with
// RESOLVE_NO_SYMLINKS on top of the usual flags (a symlink on the path,
// even one that stays inside, is refused), and the name itself is removed
// or renamed with unlinkat and renameat2 relative to that directory's
// descriptor, which act on a symlink itself, never on its target. A symlink
// swapped in while the call runs therefore makes it fail, never land
// outside.

// Delete removes the file, symlink (not its target) or directory rel. A
// directory that is not empty needs recursive, which removes everything
// below it without following a symlink and without crossing into a file
// system mounted there (see removeTree). The workspace root cannot be
// deleted. Deleted counts the entries removed, rel included.
func (w *Workspace) Delete(rel string, recursive bool) (agentproto.DeleteResult, error) {
	const op = "delete"
	var res agentproto.DeleteResult
	p, err := parsePath(op, rel)
	if err != nil {
		return res, err
	}
	base, err := nameOf(op, p)
	if err != nil {
		return res, err
	}
	root, err := w.enter()
	if err != nil {
		return res, err
	}
	defer w.mu.RUnlock()
	dir, err := openParent(root, p, op)
	if err != nil {
		return res, err
	}
	defer closeFd(dir)

	for attempt := 0; attempt < 8; attempt++ {
		st, err := lstatAt(dir, base)
		if err != nil {
			return res, nameError(op, rel, err)
		}
		res.Type = typeOf(st.Mode)
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			err := unix.Unlinkat(dir, base, 0)
			if err == unix.EISDIR {
				continue // replaced by a directory meanwhile
			}
			if err != nil {
				return res, nameError(op, rel, err)
			}
			res.Deleted = 1
			return res, nil
		}
		err = unix.Unlinkat(dir, base, unix.AT_REMOVEDIR)
		switch {
		case err == nil:
			res.Deleted = 1
			return res, nil
		case err == unix.ENOTDIR:
			continue // replaced by a file meanwhile
		case (err == unix.ENOTEMPTY || err == unix.EEXIST) && !recursive:
			return res, errcode.Errorf(errcode.InvalidArgument,
				"delete %s: the directory is not empty; set recursive to delete it with everything in it", quote(rel))
		case err != unix.ENOTEMPTY && err != unix.EEXIST:
			return res, nameError(op, rel, err)
		}
		sub, err := openChild(dir, base, unix.O_RDONLY|unix.O_DIRECTORY)
		if err == unix.EACCES {
			if err = makeAccessible(dir, base); err == nil {
				sub, err = openChild(dir, base, unix.O_RDONLY|unix.O_DIRECTORY)
			}
		}
		switch err {
		case nil:
		case unix.ENOTDIR, unix.ELOOP:
			continue // replaced meanwhile
		default:
			return res, nameError(op, rel, err)
		}
		err = removeTreeCount(sub, &res.Deleted)
		closeFd(sub)
		if err != nil {
			return res, nameError(op, rel, err)
		}
		err = unix.Unlinkat(dir, base, unix.AT_REMOVEDIR)
		if err == nil {
			res.Deleted++
			return res, nil
		}
		if err != unix.ENOTEMPTY && err != unix.EEXIST && err != unix.ENOTDIR {
			return res, nameError(op, rel, err)
		}
		// Something was created in it or swapped for it meanwhile: again.
	}
	return res, errcode.Errorf(errcode.Busy,
		"delete %s: it kept changing while it was being deleted (a running command writing to it?); stop what writes there and retry", quote(rel))
}

// Move renames from to to, both inside the workspace: a file, a symlink
// (the link itself) or a directory with everything in it. Missing parent
// directories of to are created (never through a symlink). An existing to
// is replaced only with overwrite (rename(2)'s rules then apply: a
// directory replaces only an empty directory, a file only a file);
// without it the rename is RENAME_NOREPLACE and an existing to is
// INVALID_ARGUMENT. A to ending in "/" names a directory to move into,
// keeping from's name. The result names the destination and what moved.
func (w *Workspace) Move(from, to string, overwrite bool) (agentproto.MoveResult, error) {
	const op = "move"
	var res agentproto.MoveResult
	fp, err := parsePath(op, from)
	if err != nil {
		return res, err
	}
	fromBase, err := nameOf(op, fp)
	if err != nil {
		return res, err
	}
	tp, err := parsePath(op+" to", to)
	if err != nil {
		return res, err
	}
	if tp.dirOnly && tp.comps[len(tp.comps)-1] != ".." || len(tp.comps) == 0 {
		tp.comps = append(tp.comps, fromBase) // into that directory
		tp.dirOnly = false
	}
	toBase, err := nameOf(op+" to", tp)
	if err != nil {
		return res, err
	}
	res.To = tp.String()

	root, err := w.enter()
	if err != nil {
		return res, err
	}
	defer w.mu.RUnlock()
	src, err := openParent(root, fp, op)
	if err != nil {
		return res, err
	}
	defer closeFd(src)
	st, err := lstatAt(src, fromBase)
	if err != nil {
		return res, nameError(op, from, err)
	}
	res.Type = typeOf(st.Mode)
	dst, err := mkdirParents(root, tp.comps[:len(tp.comps)-1], resolveNoSymlinks, op, to)
	if err != nil {
		return res, nameError(op, to, err)
	}
	defer closeFd(dst)

	flags := uint(unix.RENAME_NOREPLACE)
	if overwrite {
		flags = 0
	}
	err = unix.Renameat2(src, fromBase, dst, toBase, flags)
	switch err {
	case nil:
		return res, nil
	case unix.EEXIST:
		return res, errcode.Errorf(errcode.InvalidArgument,
			"move %s to %s: the destination exists; set overwrite to replace it, or choose another name", quote(from), quote(res.To))
	case unix.ENOTEMPTY:
		return res, errcode.Errorf(errcode.InvalidArgument,
			"move %s to %s: the destination is a directory that is not empty; delete it first, or move into it by ending the destination with \"/\"", quote(from), quote(res.To))
	case unix.EISDIR:
		return res, errcode.Errorf(errcode.InvalidArgument,
			"move %s to %s: the destination is a directory and the source is not; move into it by ending the destination with \"/\"", quote(from), quote(res.To))
	case unix.ENOTDIR:
		return res, errcode.Errorf(errcode.InvalidArgument,
			"move %s to %s: the source is a directory and the destination is not; delete the destination first, or choose another name", quote(from), quote(res.To))
	case unix.EINVAL:
		return res, errcode.Errorf(errcode.InvalidArgument,
			"move %s to %s: a directory cannot be moved into itself; choose a destination outside it", quote(from), quote(res.To))
	case unix.ENOENT:
		return res, nameError(op, from, err)
	}
	return res, nameError(op, from, err)
}

// nameOf returns the last component of p, which Delete and Move act on;
// the root, and a path ending in ".." (which names a directory by where it
// is, not by its name), are refused.
func nameOf(op string, p wsPath) (string, error) {
	if len(p.comps) == 0 {
		return "", errcode.Errorf(errcode.InvalidArgument,
			"%s %s: that is the workspace root, which cannot be deleted or moved; name a file or directory inside it", op, quote(p.rel))
	}
	base := p.comps[len(p.comps)-1]
	if base == ".." {
		return "", errcode.Errorf(errcode.InvalidArgument,
			`%s %s: the path ends in ".."; name the file or directory itself (for example "src/old" rather than "src/old/sub/..")`, op, quote(p.rel))
	}
	return base, nil
}

// openParent opens the directory holding p's last component with
// RESOLVE_NO_SYMLINKS (O_PATH, enough for *at calls).
func openParent(root int, p wsPath, op string) (int, error) {
	parent := wsPath{comps: p.comps[:len(p.comps)-1]}
	fd, err := openBeneath(root, parent.String(), unix.O_PATH|unix.O_DIRECTORY, resolveNoSymlinks)
	if err != nil {
		return -1, nameError(op, p.rel, err)
	}
	return fd, nil
}

// nameError is fsError for Delete and Move, which refuse every symlink on
// the path (ELOOP there means a symlink, not a loop).
func nameError(op, rel string, err error) error {
	if err == unix.ELOOP {
		return errcode.Errorf(errcode.InvalidArgument,
			"%s %s: a directory on the path is a symlink, and %s does not go through symlinks; use the real path (sandbox_list shows where a symlink points)", op, quote(rel), op)
	}
	return fsError(op, rel, err)
}
