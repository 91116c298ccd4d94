package agentclient

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

// ReadRequest is a read of part of a file: a byte range, or lines (see
// agentproto.ReadRequest for its fields and workspace.Workspace.ReadLines
// for what a line read does).
type ReadRequest = agentproto.ReadRequest

// Edit is one replacement of an edit: OldText by NewText, once, or every
// occurrence with ReplaceAll.
type Edit struct {
	OldText, NewText string
	ReplaceAll       bool
}

// EditFile makes edits in a file, in order, all or nothing (see
// workspace.Workspace.EditFile); the agent sends back the result only, never
// the file.
func (c *Conn) EditFile(ctx context.Context, path string, edits []Edit, maxFile int64) (EditResult, error) {
	var res EditResult
	req := agentproto.EditRequest{Path: path, MaxFile: maxFile}
	var size int64
	texts := make([]io.Reader, 0, 2*len(edits))
	for _, e := range edits {
		req.Edits = append(req.Edits, agentproto.EditSpec{OldSize: int64(len(e.OldText)), NewSize: int64(len(e.NewText)), ReplaceAll: e.ReplaceAll})
		texts = append(texts, strings.NewReader(e.OldText), strings.NewReader(e.NewText))
		size += int64(len(e.OldText) + len(e.NewText))
	}
	if len(edits) == 1 {
		// One edit goes in the form every version of the agent reads.
		req.OldSize, req.NewSize, req.ReplaceAll, req.Edits = req.Edits[0].OldSize, req.Edits[0].NewSize, req.Edits[0].ReplaceAll, nil
	}
	err := c.roundTrip(ctx, request{
		kind: agentproto.KindEdit, body: req, timeout: opTimeout,
		input: func(p *pending) error {
			return c.sendFrom(p, io.MultiReader(texts...), size)
		},
		onResult: func(f agentproto.Frame) error {
			if err := f.Decode(&res); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			if res.Replacements < 0 || res.Size < 0 || (maxFile > 0 && res.Size > maxFile) {
				return fmt.Errorf("%w: edit result out of bounds: %+v", errProtocol, res)
			}
			return nil
		},
	})
	return res, err
}

// Delete removes a file, a symlink or (with recursive) a directory.
func (c *Conn) Delete(ctx context.Context, path string, recursive bool) (DeleteResult, error) {
	var res DeleteResult
	err := c.roundTrip(ctx, request{
		kind: agentproto.KindDelete, body: agentproto.DeleteRequest{Path: path, Recursive: recursive}, timeout: opTimeout,
		onResult: func(f agentproto.Frame) error {
			if err := f.Decode(&res); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			if res.Deleted < 0 || !validType(res.Type) {
				return fmt.Errorf("%w: delete result out of bounds: %+v", errProtocol, res)
			}
			return nil
		},
	})
	return res, err
}

// Move renames from to to, replacing an existing to only with overwrite.
func (c *Conn) Move(ctx context.Context, from, to string, overwrite bool) (MoveResult, error) {
	var res MoveResult
	err := c.roundTrip(ctx, request{
		kind: agentproto.KindMove, body: agentproto.MoveRequest{From: from, To: to, Overwrite: overwrite}, timeout: opTimeout,
		onResult: func(f agentproto.Frame) error {
			if err := f.Decode(&res); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			if !validType(res.Type) || res.To == "" || len(res.To) > policy.MaxPathBytes+256 || !utf8.ValidString(res.To) {
				return fmt.Errorf("%w: move result out of bounds", errProtocol)
			}
			return nil
		},
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
