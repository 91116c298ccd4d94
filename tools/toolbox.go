package tools

import (
	"encoding/json"
	"strings"
)

// Toolbox is a sandbox image's manifest, written by the image's build
// (image/build.sh) and read from the image by the backend at start: what
// the image has, with versions where the build recorded them, and the
// programs a model often reaches for that it lacks.
type Toolbox struct {
	Has   []ToolboxEntry `json:"has"`
	Lacks []string       `json:"lacks,omitempty"`
}

// ToolboxEntry is one program or library of the image.
type ToolboxEntry struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
}

// maxToolboxEntries bounds what the instructions list of a manifest (it
// comes from the image, which an operator may build).
const maxToolboxEntries = 48

// ParseToolbox reads a manifest; nil when s is empty or not a manifest.
func ParseToolbox(s string) *Toolbox {
	if s == "" {
		return nil
	}
	var t Toolbox
	if err := json.Unmarshal([]byte(s), &t); err != nil || len(t.Has) == 0 {
		return nil
	}
	t.Has = t.Has[:min(len(t.Has), maxToolboxEntries)]
	t.Lacks = t.Lacks[:min(len(t.Lacks), maxToolboxEntries)]
	return &t
}

// sentence says what the image has and lacks, in a few words: versions cut
// to major.minor ("python3 3.11").
func (t *Toolbox) sentence() string {
	has := make([]string, 0, len(t.Has))
	for _, e := range t.Has {
		name := clip(e.Name, 32)
		if v := shortVersion(e.Version); v != "" {
			name += " " + v
		}
		has = append(has, name)
	}
	s := "It has " + strings.Join(has, ", ") + ". "
	if len(t.Lacks) > 0 {
		lacks := make([]string, len(t.Lacks))
		for i, l := range t.Lacks {
			lacks[i] = clip(l, 32)
		}
		s += "It lacks " + strings.Join(lacks, ", ") + ". "
	}
	return s
}

// shortVersion keeps a version's first two parts.
func shortVersion(v string) string {
	parts := strings.SplitN(clip(v, 32), ".", 3)
	return strings.Join(parts[:min(len(parts), 2)], ".")
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
