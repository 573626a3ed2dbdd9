// Package sqlname is the rule for the schema and table names that the SQL-backed
// packages (pgstore, sqlitestore, fence, pgbox, sqlitebox) let their callers choose.
//
// Those packages put every name into their statements as a quoted identifier, so the
// rule is not what makes a name safe to use: it keeps names plain. A name that follows
// it means the same quoted as unquoted, so an operator who types it unquoted (in psql or
// sqlite3) reaches the table the store uses, and it needs no escaping in logs, DSNs or
// flags.
package sqlname

// Valid reports whether s is 1 to maxLen bytes of lowercase ASCII letters, digits and
// underscores, not starting with a digit. This is the rule for PostgreSQL, which folds
// unquoted names to lower case: a name with an upper-case letter would reach another
// table when typed unquoted. maxLen leaves room, within the database's limit on names,
// for the names derived from s (sequences, indexes).
func Valid(s string, maxLen int) bool { return valid(s, maxLen, false) }

// ValidAnyCase is Valid with upper-case ASCII letters allowed too. This is the rule for
// SQLite, which matches names without regard to ASCII case, so a name's case never
// changes the table it reaches.
func ValidAnyCase(s string, maxLen int) bool { return valid(s, maxLen, true) }

func valid(s string, maxLen int, upper bool) bool {
	if s == "" || len(s) > maxLen || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || upper && c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}
