package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandbox-mcp/sandbox-mcp/session/backend"
)

// Seed is content every workspace starts with, for a read-only workspace
// baked into the runtime image.
type Seed struct {
	// Digest identifies the content; it is part of the image's tag.
	Digest string
	// Tar returns a new reader of the content as a tar stream.
	Tar func() io.Reader
}

// RuntimeImageRepo is the repository of runtime images: a base image with
// the agent added.
const RuntimeImageRepo = "sandbox-mcp-runtime"

// RuntimeImage makes sure the runtime image for base and the agent binary at
// agentPath exists, building it if needed, and returns its tag (see
// runtimeImage; this is its form for a caller that has only the paths).
func RuntimeImage(ctx context.Context, cli Engine, base, agentPath string, sd *Seed, uid, gid int) (string, error) {
	info, err := inspectBase(ctx, cli, base)
	if err != nil {
		return "", err
	}
	agent, err := readAgent(agentPath)
	if err != nil {
		return "", err
	}
	return runtimeImage(ctx, cli, imagePlan{base: base, baseID: info.ID, agent: agent, seed: sd, uid: uid, gid: gid}, func(backend.Step) {})
}

// inspectBase checks that the base image is on the engine.
func inspectBase(ctx context.Context, cli Engine, base string) (client.ImageInspectResult, error) {
	info, err := cli.ImageInspect(ctx, base)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return info, fmt.Errorf("image %q is not on this engine, and nothing can be pulled: build the default image with `make image`, or name a local image with --image", base)
		}
		return info, fmt.Errorf("inspect image %q: %w", base, err)
	}
	return info, nil
}

// agentBinary is the static agent, read once.
type agentBinary struct {
	path   string
	data   []byte
	digest string // sha256, hex
}

// readAgent reads and checks the agent binary.
func readAgent(path string) (agentBinary, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return agentBinary{}, fmt.Errorf("read the agent binary: %w (build it with `make build`, or point --agent-bin at it)", err)
	}
	if !bytes.HasPrefix(data, []byte("\x7fELF")) {
		return agentBinary{}, fmt.Errorf("agent binary %s is not a Linux executable", path)
	}
	sum := sha256.Sum256(data)
	return agentBinary{path: path, data: data, digest: hex.EncodeToString(sum[:])}, nil
}

// imagePlan is what a runtime image is made of: the base image, the agent
// (unless it is bind-mounted), and a read-only workspace's seed.
type imagePlan struct {
	base, baseID string
	agent        agentBinary
	// noAgent leaves the agent out: sandboxes get it by a bind mount.
	noAgent  bool
	seed     *Seed
	uid, gid int
}

// tag is the image's tag, derived from everything in it, so a new agent, a
// rebuilt base or a new seed gives a new image and the old one stays valid
// for servers still using it. "" means the base image itself will do.
func (p imagePlan) tag() string {
	if p.noAgent && p.seed == nil {
		return ""
	}
	keyText := p.baseID
	if !p.noAgent {
		keyText += "\x00" + p.agent.digest
	} else {
		keyText += "\x00bind"
	}
	if p.seed != nil {
		keyText += fmt.Sprintf("\x00%s\x00%d:%d", p.seed.Digest, p.uid, p.gid)
	}
	key := sha256.Sum256([]byte(keyText))
	return RuntimeImageRepo + ":" + hex.EncodeToString(key[:])[:16]
}

// buildUsually is what an image build usually takes, for the calls that
// wait for one: most of it is the engine's snapshot of the base image's
// layers, which a loaded engine does slowly.
const buildUsually = "usually 10 s to 3 min, the longer on a loaded engine"

// runtimeImage makes sure the image sandboxes run exists, building it if
// needed (telling step what it builds and why), and returns its tag. The
// build uses only local parts (the base image must be present; nothing is
// pulled).
//
// With a seed, the image also holds the seed's files in /workspace, owned by
// uid:gid: a read-only workspace that starts with content.
func runtimeImage(ctx context.Context, cli Engine, p imagePlan, step func(backend.Step)) (string, error) {
	tag := p.tag()
	if tag == "" {
		return p.baseID, nil
	}
	if _, err := cli.ImageInspect(ctx, tag); err == nil {
		return tag, nil
	} else if !cerrdefs.IsNotFound(err) {
		return "", fmt.Errorf("inspect image %q: %w", tag, err)
	}
	step(backend.Step{What: p.what(), Why: whyBuild(ctx, cli, p), Usually: buildUsually})

	dockerfile := fmt.Sprintf("FROM %s\n", p.baseID)
	files := []struct {
		name string
		mode int64
		data []byte
	}{{"Dockerfile", 0o644, nil}}
	if !p.noAgent {
		dockerfile += fmt.Sprintf("COPY agent %s\n", AgentPath)
		files = append(files, struct {
			name string
			mode int64
			data []byte
		}{"agent", 0o755, p.agent.data})
	}
	if p.seed != nil {
		dockerfile += fmt.Sprintf("COPY --chown=%d:%d workspace/ %s/\n", p.uid, p.gid, WorkspaceDir)
	}
	files[0].data = []byte(dockerfile)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			return "", err
		}
		if _, err := tw.Write(f.data); err != nil {
			return "", err
		}
	}
	if p.seed != nil {
		if err := tw.WriteHeader(&tar.Header{Name: "workspace/", Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
			return "", err
		}
		if err := p.seed.imageContext(tw); err != nil {
			return "", fmt.Errorf("seed the image's workspace: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	labels := map[string]string{
		LabelManaged:           "1",
		LabelRuntime:           "1",
		LabelRuntime + ".base": p.base,
	}
	if !p.noAgent {
		labels[LabelRuntime+".agent"] = p.agent.digest
	}
	if p.seed != nil {
		labels[LabelRuntime+".seed"] = p.seed.Digest
	}
	res, err := cli.ImageBuild(ctx, &buf, client.ImageBuildOptions{
		Tags:        []string{tag},
		Remove:      true,
		ForceRemove: true,
		PullParent:  false,
		NetworkMode: "none",
		Labels:      labels,
	})
	if err != nil {
		return "", fmt.Errorf("build runtime image from %q: %w", p.base, err)
	}
	defer res.Body.Close()
	if err := buildError(res.Body); err != nil {
		return "", fmt.Errorf("build runtime image from %q: %w", p.base, err)
	}
	if _, err := cli.ImageInspect(ctx, tag); err != nil {
		return "", fmt.Errorf("runtime image %q missing after its build: %w", tag, err)
	}
	return tag, nil
}

// what names the build for the log and the waiting calls.
func (p imagePlan) what() string {
	switch {
	case p.seed != nil && p.noAgent:
		return "building the read-only workspace's image (" + p.base + " with the --workspace-from content)"
	case p.seed != nil:
		return "building the sandbox image (" + p.base + " with the agent and the --workspace-from content)"
	}
	return "building the sandbox image (" + p.base + " with the agent added)"
}

// whyBuild says why an image must be built now: what is new to this engine
// since a runtime image of the same base was last built.
func whyBuild(ctx context.Context, cli Engine, p imagePlan) string {
	if p.seed != nil {
		return "the --workspace-from content is new to this engine, and a read-only workspace carries it in its image"
	}
	res, err := cli.ImageList(ctx, client.ImageListOptions{Filters: make(client.Filters).
		Add("label", LabelRuntime+".base="+p.base).Add("label", LabelRuntime+".agent")})
	if err != nil || len(res.Items) == 0 {
		return "it is the first start with " + p.base + " on this engine (or since its runtime images were removed)"
	}
	return "the agent changed since the last start (a new build of sandbox-agent), or the base image was rebuilt"
}

// buildError reads a build's JSON message stream and returns the error it
// reports, if any.
func buildError(r io.Reader) error {
	dec := json.NewDecoder(r)
	var last []string
	for {
		var m struct {
			Stream      string `json:"stream"`
			Error       string `json:"error"`
			ErrorDetail struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&m); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if s := strings.TrimSpace(m.Stream); s != "" {
			last = append(last, s)
			if len(last) > 5 {
				last = last[1:]
			}
		}
		if m.Error != "" {
			return fmt.Errorf("%s (%s)", m.Error, strings.Join(last, "; "))
		}
	}
}

// imageContext writes the seed's entries into a build context under
// "workspace/", for a read-only workspace baked into the runtime image.
// Permission bits only: setuid, setgid and sticky are dropped.
func (s *Seed) imageContext(tw *tar.Writer) error {
	tr := tar.NewReader(s.Tar())
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		out := &tar.Header{Name: "workspace/" + h.Name, Mode: h.Mode & 0o777, ModTime: h.ModTime, Typeflag: h.Typeflag, Linkname: h.Linkname, Size: h.Size}
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink:
		default:
			continue
		}
		if err := tw.WriteHeader(out); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return err
			}
		}
	}
}
