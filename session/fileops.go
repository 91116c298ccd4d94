package session

import (
	"context"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// The file operations that change names or text in place: the agent does
// the work next to the files (workspace.EditFile, Delete, Move), so an edit
// sends only its two strings, never the file.

// EditResult is what an edit did.
type EditResult = agentproto.EditResult

// DeleteResult is what a delete did.
type DeleteResult = agentproto.DeleteResult

// MoveResult is what a move did.
type MoveResult = agentproto.MoveResult

// ReadLines reads lines start to end (1-based, inclusive; end 0: to the
// last) of a file, at most maxBytes of them.
func (s *Sandbox) ReadLines(ctx context.Context, path string, start, end, maxBytes int64) (ReadResult, error) {
	ctx, done := s.begin(ctx)
	defer done()
	inst, err := s.ready(ctx)
	if err != nil {
		return ReadResult{}, err
	}
	res, err := inst.conn.read(ctx, agentproto.ReadRequest{Path: path, Max: maxBytes, StartLine: start, EndLine: end})
	return res, s.failed(inst, err)
}

// EditFile replaces oldText with newText in a file (every occurrence with
// replaceAll); neither the file before nor after may pass maxFile bytes.
// See workspace.Workspace.EditFile for the rules.
func (s *Sandbox) EditFile(ctx context.Context, path, oldText, newText string, replaceAll bool, maxFile int64) (EditResult, error) {
	ctx, done := s.begin(ctx)
	defer done()
	inst, err := s.ready(ctx)
	if err != nil {
		return EditResult{}, err
	}
	res, err := inst.conn.editFile(ctx, path, oldText, newText, replaceAll, maxFile)
	return res, s.failed(inst, err)
}

// Delete removes a file, a symlink or (with recursive, when not empty) a
// directory.
func (s *Sandbox) Delete(ctx context.Context, path string, recursive bool) (DeleteResult, error) {
	ctx, done := s.begin(ctx)
	defer done()
	inst, err := s.ready(ctx)
	if err != nil {
		return DeleteResult{}, err
	}
	res, err := inst.conn.deletePath(ctx, path, recursive)
	return res, s.failed(inst, err)
}

// Move renames from to to inside the workspace, replacing an existing to
// only with overwrite.
func (s *Sandbox) Move(ctx context.Context, from, to string, overwrite bool) (MoveResult, error) {
	ctx, done := s.begin(ctx)
	defer done()
	inst, err := s.ready(ctx)
	if err != nil {
		return MoveResult{}, err
	}
	res, err := inst.conn.move(ctx, from, to, overwrite)
	return res, s.failed(inst, err)
}

func (c *conn) editFile(ctx context.Context, path, oldText, newText string, replaceAll bool, maxFile int64) (EditResult, error) {
	var res EditResult
	size := int64(len(oldText) + len(newText))
	err := c.roundTrip(ctx, opTimeout, agentproto.KindEdit,
		agentproto.EditRequest{Path: path, OldSize: int64(len(oldText)), NewSize: int64(len(newText)), ReplaceAll: replaceAll, MaxFile: maxFile},
		func(p *pending) error {
			return c.sendFrom(p, io.MultiReader(strings.NewReader(oldText), strings.NewReader(newText)), size)
		},
		nil,
		func(f agentproto.Frame) error {
			if err := f.Decode(&res); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			if res.Replacements < 0 || res.Size < 0 || (maxFile > 0 && res.Size > maxFile) {
				return fmt.Errorf("%w: edit result out of bounds: %+v", errProtocol, res)
			}
			return nil
		})
	return res, err
}

func (c *conn) deletePath(ctx context.Context, path string, recursive bool) (DeleteResult, error) {
	var res DeleteResult
	err := c.roundTrip(ctx, opTimeout, agentproto.KindDelete, agentproto.DeleteRequest{Path: path, Recursive: recursive}, nil, nil,
		func(f agentproto.Frame) error {
			if err := f.Decode(&res); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			if res.Deleted < 0 || !validType(res.Type) {
				return fmt.Errorf("%w: delete result out of bounds: %+v", errProtocol, res)
			}
			return nil
		})
	return res, err
}

func (c *conn) move(ctx context.Context, from, to string, overwrite bool) (MoveResult, error) {
	var res MoveResult
	err := c.roundTrip(ctx, opTimeout, agentproto.KindMove, agentproto.MoveRequest{From: from, To: to, Overwrite: overwrite}, nil, nil,
		func(f agentproto.Frame) error {
			if err := f.Decode(&res); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			if !validType(res.Type) || res.To == "" || len(res.To) > policy.MaxPathBytes+256 || !utf8.ValidString(res.To) {
				return fmt.Errorf("%w: move result out of bounds", errProtocol)
			}
			return nil
		})
	return res, err
}

func validType(t string) bool {
	switch t {
	case agentproto.TypeFile, agentproto.TypeDir, agentproto.TypeSymlink, agentproto.TypeOther:
		return true
	}
	return false
}
