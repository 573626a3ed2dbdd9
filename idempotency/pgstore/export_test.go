package pgstore

import "time"

// Queued returns how many Claim and Complete calls wait in the store's batches for a
// statement to take them (0 without Config.Batch). Tests that need calls to go together
// in one batch read it to know the calls are queued before they free the connection the
// batch waits for.
func (s *Store) Queued() int {
	n := 0
	if s.claims != nil {
		n += s.claims.Pending()
	}
	if s.completes != nil {
		n += s.completes.Pending()
	}
	return n
}

// BatchInFlight is the most statements of one kind a Store with Config.Batch runs at
// once: tests fill every slot to make the calls that follow wait together.
const BatchInFlight = batchInFlight

// BatchPrefix begins the names under which the batched statements run.
const BatchPrefix = batchPrefix

// SetReplanAfter sets how old a connection's batched statements may be before the next
// batch prepares them again (0: at every batch).
func (s *Store) SetReplanAfter(d time.Duration) { s.replan.Store(int64(d)) }

// Open returns the number of requests the store counts open: claimed, or claiming, and
// not yet completed, released or abandoned (what its batches gather for).
func (s *Store) Open() int { return s.inflight.Count() }
