package agentclient

import (
	"context"
	"fmt"

	"github.com/sandbox-mcp/sandbox-mcp/agentproto"
)

// Setup has the agent write the CA bundle and take the sandbox's
// environment (see agentproto.SetupRequest), before any command runs.
func (c *Conn) Setup(ctx context.Context, req agentproto.SetupRequest) (agentproto.SetupResult, error) {
	var res agentproto.SetupResult
	err := c.roundTrip(ctx, request{
		kind: agentproto.KindSetup, body: req, timeout: opTimeout,
		onResult: func(f agentproto.Frame) error {
			if err := f.Decode(&res); err != nil {
				return fmt.Errorf("%w: %v", errProtocol, err)
			}
			return nil
		},
	})
	return res, err
}
