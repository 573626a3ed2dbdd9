package grpcdeadline_test

import (
	"context"
	"fmt"
	"time"
)

// A budget of 2 s sent over HTTP to service A, which calls gRPC service B, which calls
// HTTP service C: each hop has less than the one before by at least the 100 ms reserve.
func Example() {
	ch, err := startChain(100*time.Millisecond, 100*time.Millisecond)
	if err != nil {
		panic(err)
	}
	defer ch.close()
	code, _, body, err := ch.call(context.Background(), 2*time.Second)
	if err != nil {
		panic(err)
	}
	fmt.Println(code, body)
	fmt.Println("A within the client's 2s:", ch.a <= 2*time.Second)
	fmt.Println("B (gRPC deadline) at least 100ms below A:", ch.b <= ch.a-100*time.Millisecond)
	fmt.Println("C (Request-Budget-Ms) at least 100ms below B:", ch.c <= ch.b-100*time.Millisecond)
	// Output:
	// 200 done by C
	// A within the client's 2s: true
	// B (gRPC deadline) at least 100ms below A: true
	// C (Request-Budget-Ms) at least 100ms below B: true
}
