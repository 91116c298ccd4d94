package docker

import (
	"errors"
	"fmt"
	"os"

	"github.com/google/nftables"
)

// RemoveFirewallTable deletes the nftables table (family inet) called table
// with every rule in it: `sandbox-mcp uninstall` passes FirewallTable. It
// reports whether the table existed. Only do this when no server runs: a
// live server's sandboxes would lose their isolation until its reconcile
// loop puts the rules back.
func RemoveFirewallTable(table string) (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, fmt.Errorf("nftables: %w", err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		if errors.Is(err, os.ErrPermission) {
			return false, fmt.Errorf("nftables: list tables: %w (needs root or CAP_NET_ADMIN)", err)
		}
		return false, fmt.Errorf("nftables: list tables: %w", err)
	}
	for _, t := range tables {
		if t.Name != table {
			continue
		}
		c.DelTable(t)
		if err := c.Flush(); err != nil {
			return true, fmt.Errorf("nftables: delete table inet %s: %w", table, err)
		}
		return true, nil
	}
	return false, nil
}
