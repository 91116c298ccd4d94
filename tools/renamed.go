package tools

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandbox-mcp/sandbox-mcp/internal/errcode"
)

// renamedArgs are, per tool, the arguments models send that the tool does
// not take, each with the sentence that names the right ones. The SDK
// refuses such a call against the input schema (no other properties are
// allowed), and codeErrors answers with the sentence instead of the
// schema's message.
var renamedArgs = map[string]map[string]string{
	NameReadFile: readRenamed,
}

// renamedArgument is the refusal of a tools/call request that passes an
// argument its tool lists in renamedArgs, or "" when it passes none.
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
