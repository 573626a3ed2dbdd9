package memstore

import (
	"context"

	"github.com/retrysafe/retrysafe/idempotency"
)

// CheckPersistence is the Check of Inspect's one finding.
const CheckPersistence = "memory.persistence"

var _ idempotency.Inspector = (*Store)(nil)

// Inspect implements idempotency.Inspector. It always reports one warning: the records
// live in this process only, so a restart forgets every key, and processes do not share
// them.
func (s *Store) Inspect(ctx context.Context) ([]idempotency.Finding, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	s.mu.Unlock()
	return []idempotency.Finding{{
		Level:   idempotency.FindingWarn,
		Check:   CheckPersistence,
		Setting: "memory: (records in this process only)",
		Detail: "nothing survives the process: after a restart every key would run again, " +
			"and a retry that reaches another process runs again",
	}}, nil
}
