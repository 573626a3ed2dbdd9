package gateway

import "testing"

// A copy buffer goes back to the pool and comes out again without an allocation, and
// a buffer of another size is not kept.
func TestBufferPoolReusesWithoutAllocating(t *testing.T) {
	var p bufferPool
	p.Put(p.Get()) // the pool's first buffer
	if n := testing.AllocsPerRun(100, func() { p.Put(p.Get()[:10]) }); n != 0 {
		t.Errorf("a Get and a Put allocate %v times, want 0", n)
	}
	p.Put(make([]byte, 100))
	if b := p.Get(); len(b) != copyBufferSize {
		t.Errorf("Get returned %d bytes, want %d", len(b), copyBufferSize)
	}
}
