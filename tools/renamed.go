package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// renamedArgs are, per tool, the arguments models send that the tool does
// not take (the names other agents' tools use), each with the sentence
// that names the right ones. The SDK refuses such a call against the input
// schema (no other properties are allowed), and codeErrors answers with
// the sentence instead of the schema's message.
var renamedArgs = map[string]map[string]string{
	NameExec:      execRenamed,
	NameReadFile:  withFilePath(readRenamed),
	NameWriteFile: withFilePath(nil),
	NameEditFile:  withFilePath(nil),
	NameDelete:    withFilePath(nil),
	NameList:      withFilePath(nil),
	NameViewImage: withFilePath(nil),
}

// execRenamed are the arguments of other agents' shell tools.
var execRenamed = map[string]string{
	"timeout":           "timeout_ms is the timeout, in milliseconds (timeout_ms: 120000 for two minutes)",
	"workdir":           "cwd is the working directory, relative to /workspace",
	"working_directory": "cwd is the working directory, relative to /workspace",
	"cmd":               "command is a shell line (a string); argv is a program and its arguments as a list",
}

// withFilePath adds file_path, the path argument of other agents' file
// tools, to a tool's renamed arguments.
func withFilePath(m map[string]string) map[string]string {
	out := map[string]string{"file_path": "path is the file's path, relative to /workspace"}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// renamedArgument is the refusal of a tools/call request that passes an
// argument its tool lists in renamedArgs, or one of the wrong type a
// model's habit explains (command as a list), or "" when it passes none.
func renamedArgument(req mcp.Request) string {
	call, ok := req.(*mcp.CallToolRequest)
	if !ok || call.Params == nil {
		return ""
	}
	table := renamedArgs[call.Params.Name]
	if len(table) == 0 {
		return ""
	}
	var args map[string]json.RawMessage
	if json.Unmarshal(call.Params.Arguments, &args) != nil {
		return ""
	}
	if call.Params.Name == NameExec && bytes.HasPrefix(bytes.TrimSpace(args["command"]), []byte("[")) {
		return fmt.Sprintf("%s: %s's command is a shell line, a string (\"ls -la | head\"); to pass a program and its arguments as a list, use argv ([\"ls\", \"-la\"])", errcode.InvalidArgument, NameExec)
	}
	var names []string
	for name := range args {
		if _, ok := table[name]; ok {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	slices.Sort(names)
	return fmt.Sprintf("%s: %s takes no %s: %s", errcode.InvalidArgument, call.Params.Name, names[0], table[names[0]])
}

// acceptedArgs are, per tool, arguments models send that mean no harm:
// each is renamed to the tool's own (its value kept), or dropped when the
// new name is "".
var acceptedArgs = map[string]map[string]string{
	NameExec: {
		"description":       "", // a note for a human, as other shell tools take
		"run_in_background": "background",
	},
}

// acceptHabits is a receiving middleware that renames or drops, before the
// SDK checks a call's arguments against its tool's schema, the harmless
// arguments acceptedArgs lists. A name already given wins over its alias.
func acceptHabits(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		call, ok := req.(*mcp.CallToolRequest)
		if !ok || method != "tools/call" || call.Params == nil {
			return next(ctx, method, req)
		}
		table := acceptedArgs[call.Params.Name]
		raw := call.Params.Arguments
		found := false
		for name := range table {
			if bytes.Contains(raw, []byte(`"`+name+`"`)) {
				found = true
			}
		}
		if !found {
			return next(ctx, method, req)
		}
		var args map[string]json.RawMessage
		if json.Unmarshal(raw, &args) != nil {
			return next(ctx, method, req) // the SDK says what is wrong
		}
		changed := false
		for name, to := range table {
			v, ok := args[name]
			if !ok {
				continue
			}
			delete(args, name)
			changed = true
			if _, given := args[to]; to != "" && !given {
				args[to] = v
			}
		}
		if changed {
			b, err := json.Marshal(args)
			if err != nil {
				return nil, fmt.Errorf("tools: re-encode arguments: %w", err)
			}
			call.Params.Arguments = b
		}
		return next(ctx, method, req)
	}
}
