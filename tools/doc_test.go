package tools

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// toolsDoc is the manual whose "Every field" section is generated from the
// golden schemas.
var toolsDoc = filepath.Join("..", "docs", "tools.md")

// fieldsHeading starts the generated section, which runs to the end of
// toolsDoc.
const fieldsHeading = "## Every field\n"

// toolOrder is the order of the tools in the section.
var toolOrder = []string{
	"sandbox_exec", "sandbox_job", "sandbox_read_file", "sandbox_view_image", "sandbox_write_file",
	"sandbox_edit_file", "sandbox_delete", "sandbox_move", "sandbox_list", "sandbox_snapshot",
	"sandbox_restore", "sandbox_snapshot_delete", "sandbox_create", "sandbox_status", "sandbox_end", "sandbox_expose",
}

// TestToolsDocCoversEveryField: docs/tools.md's "Every field" section is
// what the golden schemas say, a table row for every input and result
// field of every tool (nested ones as parent.field or parent[].field), so
// the manual cannot fall behind the schemas. After an intended schema
// change, `go test ./tools -run 'TestGolden|TestToolsDoc' -update` rewrites
// both.
func TestToolsDocCoversEveryField(t *testing.T) {
	doc, err := os.ReadFile(toolsDoc)
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join("testdata", "*.golden.json"))
	var names []string
	for _, f := range files {
		names = append(names, strings.TrimSuffix(filepath.Base(f), ".golden.json"))
	}
	sort.Strings(names)
	ordered := append([]string(nil), toolOrder...)
	sort.Strings(ordered)
	if strings.Join(names, ",") != strings.Join(ordered, ",") {
		t.Fatalf("toolOrder (doc_test.go) lists %v, the golden files are %v: add the new tool to toolOrder", toolOrder, names)
	}
	want, err := fieldsSection()
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(doc), fieldsHeading)
	if *update {
		if i < 0 {
			i = len(doc)
		}
		if err := os.WriteFile(toolsDoc, []byte(string(doc[:i])+want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if i < 0 {
		t.Fatalf("docs/tools.md has no %q section: run go test ./tools -run TestToolsDoc -update", strings.TrimSpace(fieldsHeading))
	}
	got := string(doc[i:])
	if got == want {
		return
	}
	gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
	for n := 0; n < max(len(gl), len(wl)); n++ {
		var g, w string
		if n < len(gl) {
			g = gl[n]
		}
		if n < len(wl) {
			w = wl[n]
		}
		if g != w {
			t.Fatalf("docs/tools.md's %q section differs from the schemas, from its line %d:\n got: %s\nwant: %s\nrun go test ./tools -run TestToolsDoc -update after an intended change", strings.TrimSpace(fieldsHeading), n+1, g, w)
		}
	}
}

type docSchema struct {
	Type        any                  `json:"type"`
	Description string               `json:"description"`
	Enum        []any                `json:"enum"`
	Properties  map[string]docSchema `json:"properties"`
	Items       *docSchema           `json:"items"`
	Required    []string             `json:"required"`
}

func (s docSchema) typeName() string {
	var types []string
	switch t := s.Type.(type) {
	case string:
		types = []string{t}
	case []any:
		for _, x := range t {
			if x != "null" {
				types = append(types, fmt.Sprint(x))
			}
		}
	}
	name := strings.Join(types, "/")
	switch {
	case name == "array" && s.Items != nil && s.Items.Properties != nil:
		return "object[]"
	case name == "array" && s.Items != nil:
		return s.Items.typeName() + "[]"
	case len(s.Enum) > 0:
		var e []string
		for _, v := range s.Enum {
			e = append(e, fmt.Sprintf("`%v`", v))
		}
		return strings.Join(e, ` \| `)
	case name == "":
		return "any"
	}
	return name
}

// rows renders one table row per field, nested fields after their parent.
func (s docSchema) rows(prefix string) []string {
	keys := make([]string, 0, len(s.Properties))
	for k := range s.Properties {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []string
	for _, k := range keys {
		p := s.Properties[k]
		desc := strings.ReplaceAll(strings.ReplaceAll(p.Description, "|", `\|`), "\n", " ")
		out = append(out, fmt.Sprintf("| `%s%s` | %s | %s |", prefix, k, p.typeName(), desc))
		if p.Properties != nil {
			out = append(out, p.rows(prefix+k+".")...)
		}
		if p.Items != nil && p.Items.Properties != nil {
			out = append(out, p.Items.rows(prefix+k+"[].")...)
		}
	}
	return out
}

// fieldsSection renders the "Every field" section from the golden schemas.
func fieldsSection() (string, error) {
	o := []string{
		strings.TrimSuffix(fieldsHeading, "\n"), "",
		"Generated from the schemas the server publishes (`tools/testdata/*.golden.json`) by",
		"`go test ./tools -run TestToolsDoc -update`, and checked against them without `-update`. Input fields",
		"are what the model sends; result fields what it gets back, in `structuredContent` and, for clients",
		"that read only text, in the text.", "",
	}
	for _, name := range toolOrder {
		b, err := os.ReadFile(filepath.Join("testdata", name+".golden.json"))
		if err != nil {
			return "", err
		}
		var tool struct {
			Description string         `json:"description"`
			Annotations map[string]any `json:"annotations"`
			Input       docSchema      `json:"inputSchema"`
			Output      *docSchema     `json:"outputSchema"`
		}
		if err := json.Unmarshal(b, &tool); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		o = append(o, "### `"+name+"`", "", strings.ReplaceAll(tool.Description, "\n", " "), "")
		var ann []string
		for k, v := range tool.Annotations {
			if k != "title" {
				ann = append(ann, fmt.Sprintf("%s %v", k, v))
			}
		}
		sort.Strings(ann)
		o = append(o, "Annotations: "+strings.Join(ann, ", ")+".", "")
		o = append(o, "| input | type | meaning |", "|---|---|---|")
		o = append(o, tool.Input.rows("")...)
		if len(tool.Input.Required) > 0 {
			req := append([]string(nil), tool.Input.Required...)
			sort.Strings(req)
			for i := range req {
				req[i] = "`" + req[i] + "`"
			}
			o = append(o, "", "Required: "+strings.Join(req, ", ")+".")
		}
		o = append(o, "")
		if tool.Output != nil && len(tool.Output.Properties) > 0 {
			o = append(o, "| result | type | meaning |", "|---|---|---|")
			o = append(o, tool.Output.rows("")...)
		} else {
			o = append(o, "No structured result: the answer is content blocks alone.")
		}
		o = append(o, "")
	}
	return strings.Join(o, "\n"), nil
}
