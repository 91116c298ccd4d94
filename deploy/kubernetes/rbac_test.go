package kubernetes_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/sandbox-mcp/sandbox-mcp/session/backend/kube"
)

// TestRoleGrantsWhatTheBackendUses: the Role in rbac.yaml grants exactly
// the permissions the backend lists in kube.Permissions (what doctor checks
// on a live cluster), no fewer and no more.
func TestRoleGrantsWhatTheBackendUses(t *testing.T) {
	raw, err := os.ReadFile("rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var role *rbacv1.Role
	for doc := range strings.SplitSeq(string(raw), "\n---\n") {
		var r rbacv1.Role
		if err := yaml.Unmarshal([]byte(doc), &r); err != nil {
			t.Fatalf("rbac.yaml: %v", err)
		}
		if r.Kind == "Role" {
			role = &r
		}
	}
	if role == nil {
		t.Fatal("rbac.yaml has no Role")
	}
	granted := map[string]bool{}
	for _, rule := range role.Rules {
		for _, g := range rule.APIGroups {
			for _, res := range rule.Resources {
				for _, v := range rule.Verbs {
					granted[g+" "+res+" "+v] = true
				}
			}
		}
		if len(rule.ResourceNames) != 0 || len(rule.NonResourceURLs) != 0 {
			t.Errorf("rule %+v: names or URLs the backend does not use", rule)
		}
	}
	used := map[string]bool{}
	for _, p := range kube.Permissions {
		res := p.Resource
		if p.Subresource != "" {
			res += "/" + p.Subresource
		}
		for _, v := range p.Verbs {
			used[p.Group+" "+res+" "+v] = true
		}
	}
	var missing, extra []string
	for k := range used {
		if !granted[k] {
			missing = append(missing, k)
		}
	}
	for k := range granted {
		if !used[k] {
			extra = append(extra, k)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Errorf("rbac.yaml's Role lacks %q (the backend uses them) and grants %q (the backend does not use them)", missing, extra)
	}
}
