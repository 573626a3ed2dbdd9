//go:build !pgcpuab

package bench

// abCases are the cases BenchmarkPostgresCPU runs beside its own: none in a plain
// build. Built with -tags pgcpuab, a file that provides abCases instead (not kept in the
// repository) adds cases of a variant, for instance a copy of an earlier pgstore, so
// that a change is measured against the code before it in the same run, round by round.
func abCases(*pgcpuEnv) []*cpuCase { return nil }
