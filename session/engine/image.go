package engine

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
// agentPath exists, building it if needed, and returns its tag. The build
// uses only local parts (the base image must be present; nothing is pulled),
// and the tag is derived from the base image's id and the agent's digest, so
// a new agent or a rebuilt base gives a new image and the old one stays
// valid for servers still using it.
//
// With a seed, the image also holds the seed's files in /workspace, owned by
// uid:gid: a read-only workspace that starts with content.
func RuntimeImage(ctx context.Context, cli Engine, base, agentPath string, sd *Seed, uid, gid int) (string, error) {
	info, err := cli.ImageInspect(ctx, base)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return "", fmt.Errorf("image %q is not on this engine, and nothing can be pulled: build the default image with `make image`, or name a local image with --image", base)
		}
		return "", fmt.Errorf("inspect image %q: %w", base, err)
	}
	agent, err := os.ReadFile(agentPath)
	if err != nil {
		return "", fmt.Errorf("read the agent binary: %w (build it with `make build`, or point --agent-bin at it)", err)
	}
	if !bytes.HasPrefix(agent, []byte("\x7fELF")) {
		return "", fmt.Errorf("agent binary %s is not a Linux executable", agentPath)
	}
	sum := sha256.Sum256(agent)
	agentDigest := hex.EncodeToString(sum[:])
	keyText := info.ID + "\x00" + agentDigest
	if sd != nil {
		keyText += fmt.Sprintf("\x00%s\x00%d:%d", sd.Digest, uid, gid)
	}
	key := sha256.Sum256([]byte(keyText))
	tag := RuntimeImageRepo + ":" + hex.EncodeToString(key[:])[:16]

	if _, err := cli.ImageInspect(ctx, tag); err == nil {
		return tag, nil
	} else if !cerrdefs.IsNotFound(err) {
		return "", fmt.Errorf("inspect image %q: %w", tag, err)
	}

	dockerfile := fmt.Sprintf("FROM %s\nCOPY agent %s\n", info.ID, AgentPath)
	if sd != nil {
		dockerfile += fmt.Sprintf("COPY --chown=%d:%d workspace/ %s/\n", uid, gid, WorkspaceDir)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []struct {
		name string
		mode int64
		data []byte
	}{{"Dockerfile", 0o644, []byte(dockerfile)}, {"agent", 0o755, agent}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			return "", err
		}
		if _, err := tw.Write(f.data); err != nil {
			return "", err
		}
	}
	if sd != nil {
		if err := tw.WriteHeader(&tar.Header{Name: "workspace/", Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
			return "", err
		}
		if err := sd.imageContext(tw); err != nil {
			return "", fmt.Errorf("seed the image's workspace: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	res, err := cli.ImageBuild(ctx, &buf, client.ImageBuildOptions{
		Tags:        []string{tag},
		Remove:      true,
		ForceRemove: true,
		PullParent:  false,
		NetworkMode: "none",
		Labels: map[string]string{
			LabelManaged:            "1",
			LabelRuntime:            "1",
			LabelRuntime + ".base":  base,
			LabelRuntime + ".agent": agentDigest,
		},
	})
	if err != nil {
		return "", fmt.Errorf("build runtime image from %q: %w", base, err)
	}
	defer res.Body.Close()
	if err := buildError(res.Body); err != nil {
		return "", fmt.Errorf("build runtime image from %q: %w", base, err)
	}
	if _, err := cli.ImageInspect(ctx, tag); err != nil {
		return "", fmt.Errorf("runtime image %q missing after its build: %w", tag, err)
	}
	return tag, nil
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
