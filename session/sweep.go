package session

import "context"

// Sweep removes what servers that are gone left behind (see
// backend.Backend.Sweep); NewManager runs it once.
func (m *Manager) Sweep(ctx context.Context) error {
	return m.backend.Sweep(ctx)
}
