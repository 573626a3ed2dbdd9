package pgstore

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
