package tools

import (
	"fmt"

	"github.com/google/jsonschema-go/jsonschema"
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
