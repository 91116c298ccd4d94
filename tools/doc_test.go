package tools

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestToolsDocCoversEveryField: docs/tools.md has a section for every tool
// whose schema is pinned in testdata, and a row for each of its input and
// result fields (nested ones as parent.field or parent[].field), so the
// manual cannot fall behind the schemas. After a schema change, regenerate
// the "Every field" section from the golden files.
func TestToolsDocCoversEveryField(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "tools.md"))
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join("testdata", "*.golden.json"))
	if len(files) == 0 {
		t.Fatal("no golden schemas")
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".golden.json")
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var tool struct {
			Input  schema `json:"inputSchema"`
			Output schema `json:"outputSchema"`
		}
		if err := json.Unmarshal(b, &tool); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		head := "\n### `" + name + "`\n"
		i := strings.Index(string(doc), head)
		if i < 0 {
			t.Errorf("docs/tools.md has no %q section", strings.TrimSpace(head))
			continue
		}
		sec := string(doc)[i+len(head):]
		if j := strings.Index(sec, "\n### "); j >= 0 {
			sec = sec[:j]
		}
		for _, field := range append(tool.Input.fields(""), tool.Output.fields("")...) {
			if !strings.Contains(sec, "| `"+field+"` |") {
				t.Errorf("docs/tools.md, %s: no row for the field %s", name, field)
			}
		}
	}
}

type schema struct {
	Properties map[string]schema `json:"properties"`
	Items      *schema           `json:"items"`
}

// fields lists the schema's property names, nested ones under their parent.
func (s schema) fields(prefix string) []string {
	var out []string
	for k, p := range s.Properties {
		out = append(out, prefix+k)
		out = append(out, p.fields(prefix+k+".")...)
		if p.Items != nil {
			out = append(out, p.Items.fields(prefix+k+"[].")...)
		}
	}
	sort.Strings(out)
	return out
}
