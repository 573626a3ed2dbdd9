package redisstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/retrysafe/retrysafe/harness/redisha"
	"github.com/retrysafe/retrysafe/harness/testenv"
	"github.com/retrysafe/retrysafe/idempotency"
)

// BenchmarkClaimComplete claims and completes fresh keys from many goroutines: on the
// test Redis, and on a disposable master with one replica, without and with waiting for
// it (Config.Wait 1: the scripts go in a pipeline with WAIT).
func BenchmarkClaimComplete(b *testing.B) {
	b.Run("shared", func(b *testing.B) {
		opts, err := redis.ParseURL(testenv.RedisURL(b))
		if err != nil {
			b.Fatal(err)
		}
		benchmarkClaimComplete(b, opts.Addr, Config{})
	})
	g := redisha.Start(b, redisha.Options{NoSentinel: true})
	for _, wait := range []int{0, 1} {
		b.Run(fmt.Sprintf("replicated/wait=%d", wait), func(b *testing.B) {
			benchmarkClaimComplete(b, g.Master().Addr, Config{Wait: wait})
		})
	}
}

func benchmarkClaimComplete(b *testing.B, addr string, cfg Config) {
	client := redis.NewClient(&redis.Options{Addr: addr})
	b.Cleanup(func() { _ = client.Close() })
	prefix := testenv.Name("bench") + ":"
	b.Cleanup(func() {
		ctx := context.Background()
		iter := client.Scan(ctx, 0, globEscape(prefix)+"*", 1000).Iterator()
		for iter.Next(ctx) {
			client.Del(ctx, iter.Val())
		}
	})
	cfg.Client, cfg.Prefix = client, prefix
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var next atomic.Int64
	resp := idempotency.Response{Status: 200, Body: []byte(`{"id":"pay_123","status":"ok"}`),
		Header: map[string][]string{"Content-Type": {"application/json"}}}
	b.SetParallelism(8) // many requests per CPU, as a server has
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := fmt.Sprint(next.Add(1))
			res, err := s.Claim(ctx, idempotency.ClaimRequest{Scope: "s", Key: key, Fingerprint: "fp",
				ID: key, Lease: time.Minute, TTL: time.Hour})
			if err != nil || !res.Claimed {
				b.Fatal(res, err)
			}
			if err := s.Complete(ctx, idempotency.Completion{Scope: "s", Key: key, Token: res.Token,
				TTL: time.Hour, Response: resp}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
