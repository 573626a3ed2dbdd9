// Package bench holds the benchmarks of the idempotency core and of the payments
// example, and nothing else: the code is in the _test.go files, the figures and the
// commands that produced them in README.md.
//
//	cd bench && go test -run '^$' -bench . -benchtime 5s -count 3   (bench is a module of its own)
//
// Plain go test compiles the benchmarks but runs none. The PostgreSQL benchmarks find
// their server as the integration tests do (RETRYSAFE_POSTGRES_URL, else the local
// default) and skip when none answers.
package bench
