package tools

import (
	"encoding/json"
	"fmt"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/sandbox-mcp/sandbox-mcp/policy"
)

// inputSchema infers the schema of In and lets edit tighten it. Slices and
// maps lose the "null" type inference gives them (a nil Go value marshals to
// null, but a caller must send an array or object).
func inputSchema[In any](edit func(*jsonschema.Schema)) *jsonschema.Schema {
	s, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("tools: schema of %T: %v", *new(In), err))
	}
	dropNull(s)
	if edit != nil {
		edit(s)
	}
	return s
}

// outputSchema infers the schema of Out.
func outputSchema[Out any]() *jsonschema.Schema {
	return inputSchema[Out](nil)
}

// dropNull turns ["null", T] types into T throughout s.
func dropNull(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	if len(s.Types) == 2 && s.Types[0] == "null" {
		s.Type, s.Types = s.Types[1], nil
	}
	for _, p := range s.Properties {
		dropNull(p)
	}
	dropNull(s.Items)
	dropNull(s.AdditionalProperties)
}

func intp(v int) *int { return &v }

func execInputSchema(p policy.Policy) *jsonschema.Schema {
	return inputSchema[ExecIn](func(s *jsonschema.Schema) {
		argv := s.Properties["argv"]
		argv.MinItems, argv.MaxItems = intp(1), intp(policy.MaxArgv)
		argv.Items.MinLength = nil
		env := s.Properties["env"]
		env.PropertyNames = &jsonschema.Schema{Type: "string", Pattern: `^[A-Za-z_][A-Za-z0-9_]*$`}
		to := s.Properties["timeout_ms"]
		to.Minimum = new(float64(0))
		to.Maximum = new(float64(p.MaxExecTimeout.Milliseconds()))
		to.Description += fmt.Sprintf(" Default %d, at most %d.", p.ExecTimeout.Milliseconds(), p.MaxExecTimeout.Milliseconds())
	})
}

func writeSchemaEdit(s *jsonschema.Schema) {
	s.Properties["encoding"].Enum = []any{"utf-8", "base64"}
	s.Properties["encoding"].Default = json.RawMessage(`"utf-8"`)
	s.Properties["mode"].Pattern = `^(0o)?[0-7]{1,4}$`
	s.Properties["mode"].Default = json.RawMessage(`"0644"`)
}

func listSchemaEdit(s *jsonschema.Schema) {
	m := s.Properties["max_entries"]
	m.Minimum = new(float64(0))
	m.Maximum = new(float64(policy.MaxListEntries))
}

func readSchemaEdit(s *jsonschema.Schema) {
	s.Properties["encoding"].Enum = []any{"utf-8", "base64"}
	for _, k := range []string{"start_line", "end_line"} {
		s.Properties[k].Minimum = new(float64(1))
	}
	for _, k := range []string{"offset", "length"} {
		s.Properties[k].Minimum = new(float64(0))
	}
}
