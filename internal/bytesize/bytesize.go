// Package bytesize reads and writes sizes in bytes as people write them: 4MiB, 512KiB,
// 1GB. It is shared by the command line's flags and the gateway's configuration file,
// so that a size means the same in both.
package bytesize

import (
	"fmt"
	"strconv"
	"strings"
)

// The largest size Parse accepts: 4 EiB, far past any limit a gateway sets, and small
// enough that a size plus a few bytes of slack cannot overflow an int64.
const maxSize = 1 << 62

// unit returns the multiplier of a unit, in any case: "" and B are bytes; K, KiB, M,
// MiB, G, GiB powers of 1024; KB, MB, GB powers of 1000.
func unit(u string) (int64, bool) {
	switch strings.ToLower(u) {
	case "", "b":
		return 1, true
	case "k", "kib":
		return 1 << 10, true
	case "kb":
		return 1000, true
	case "m", "mib":
		return 1 << 20, true
	case "mb":
		return 1000 * 1000, true
	case "g", "gib":
		return 1 << 30, true
	case "gb":
		return 1000 * 1000 * 1000, true
	}
	return 0, false
}

// Parse reads a size: a non-negative integer with an optional unit, B, KiB, MiB, GiB
// (powers of 1024; K, M and G alone are the same), or KB, MB, GB (powers of 1000), in
// any case, with optional blanks between the number and the unit. Fractions and
// negative numbers are errors, so that a size is always a whole number of bytes.
func Parse(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("invalid size %q: want bytes, or a number with KiB, MiB or GiB (e.g. 512KiB, 4MiB)", s)
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	u := strings.TrimSpace(t[i:])
	mult, known := unit(u)
	switch {
	case !known:
		return 0, fmt.Errorf("invalid size %q: unknown unit %q (use B, KiB, MiB, GiB, KB, MB or GB)", s, u)
	case err != nil, n > maxSize/mult:
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	return n * mult, nil
}

// Format writes n in the largest power-of-1024 unit that divides it exactly (4MiB,
// 512KiB, 1GiB), or as plain bytes, so that Parse(Format(n)) is n.
func Format(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + "GiB"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "KiB"
	}
	return strconv.FormatInt(n, 10)
}
