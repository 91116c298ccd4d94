package session

import (
	"context"

	"github.com/sandbox-mcp/sandbox-mcp/agentclient"
)

// The file operations that change names or text in place: the agent does
// the work next to the files (workspace.EditFile, Delete, Move), so an edit
// sends only its two strings, never the file.

// EditResult is what an edit did.
type EditResult = agentclient.EditResult

// DeleteResult is what a delete did.
type DeleteResult = agentclient.DeleteResult

// MoveResult is what a move did.
type MoveResult = agentclient.MoveResult

// ReadRequest is a read of part of a file: a byte range, or lines (see
// agentproto.ReadRequest for its fields and workspace.Workspace.ReadLines
// for what a line read does).
type ReadRequest = agentclient.ReadRequest

// Edit is one replacement of an edit: OldText by NewText, once, or every
// occurrence with ReplaceAll.
type Edit = agentclient.Edit

// Read reads what req asks for: ReadFile for any read, lines included.
func (s *Sandbox) Read(ctx context.Context, req ReadRequest) (ReadResult, error) {
	return call(ctx, s, func(ctx context.Context, inst *instance) (ReadResult, error) {
		return inst.conn.Read(ctx, req)
	})
}

// EditFile makes edits in a file, in order, each on the text the ones
// before it left, all or nothing; neither the file before nor after any of
// them may pass maxFile bytes. See workspace.Workspace.EditFile for the
// rules.
func (s *Sandbox) EditFile(ctx context.Context, path string, edits []Edit, maxFile int64) (EditResult, error) {
	return call(ctx, s, func(ctx context.Context, inst *instance) (EditResult, error) {
		return inst.conn.EditFile(ctx, path, edits, maxFile)
	})
}

// Delete removes a file, a symlink or (with recursive, when not empty) a
// directory.
func (s *Sandbox) Delete(ctx context.Context, path string, recursive bool) (DeleteResult, error) {
	return call(ctx, s, func(ctx context.Context, inst *instance) (DeleteResult, error) {
		return inst.conn.Delete(ctx, path, recursive)
	})
}

// Move renames from to to inside the workspace, replacing an existing to
// only with overwrite.
func (s *Sandbox) Move(ctx context.Context, from, to string, overwrite bool) (MoveResult, error) {
	return call(ctx, s, func(ctx context.Context, inst *instance) (MoveResult, error) {
		return inst.conn.Move(ctx, from, to, overwrite)
	})
}
