package pgstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/idempotency"
)

// Checks of Inspect: the Check of each Finding it reports.
const (
	// CheckRecovery is whether the server is a standby (pg_is_in_recovery()): refused,
	// since a standby takes no writes.
	CheckRecovery = "postgres.recovery"
	// CheckFsync is the fsync setting.
	CheckFsync = "postgres.fsync"
	// CheckSynchronousCommit is synchronous_commit as the store's sessions have it (the
	// server's, or the role's or database's own).
	CheckSynchronousCommit = "postgres.synchronous_commit"
	// CheckStandby is one finding per standby streaming from the server (its
	// sync_state), per synchronous standby named and not connected, or one for no
	// standby at all.
	CheckStandby = "postgres.standby"
	// CheckPrivileges is what the store's role cannot see: the standbys' sync_state
	// without pg_read_all_stats (or pg_monitor).
	CheckPrivileges = "postgres.privileges"
)

var _ idempotency.Inspector = (*Store)(nil)

// Inspect implements idempotency.Inspector. On one connection of the store's pool, so
// with the settings the store's sessions have, it reads pg_is_in_recovery(), fsync,
// synchronous_commit, synchronous_standby_names and the standbys streaming from the
// server (pg_stat_replication, without the logical replication clients), and says what
// each means for the promise that a keyed request runs once. It writes nothing and
// needs no privilege: a role that may not see the standbys' sync_state (only
// pg_read_all_stats or pg_monitor may) gets a warning naming the role to grant.
func (s *Store) Inspect(ctx context.Context) ([]idempotency.Finding, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgstore: inspect: %w", err)
	}
	defer conn.Release()
	var st pgSetup
	err = conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('fsync'),
		current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
		current_user, pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')`).Scan(
		&st.recovery, &st.fsync, &st.syncCommit, &st.syncNames, &st.role, &st.seesStats)
	if err != nil {
		return nil, fmt.Errorf("pgstore: inspect: %w", err)
	}
	// A WAL sender that serves a logical slot feeds a subscriber, not a standby that
	// could be promoted. pg_replication_slots is readable by any role.
	rows, err := conn.Query(ctx, `SELECT coalesce(r.application_name, ''), coalesce(host(r.client_addr), ''), r.state, r.sync_state
		FROM pg_stat_replication AS r
		WHERE NOT EXISTS (SELECT FROM pg_replication_slots AS s WHERE s.active_pid = r.pid AND s.slot_type = 'logical')
		ORDER BY r.application_name, r.pid`)
	if err != nil {
		return nil, fmt.Errorf("pgstore: inspect: %w", err)
	}
	st.standbys, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (pgStandby, error) {
		var sb pgStandby
		var state, sync *string
		err := row.Scan(&sb.name, &sb.addr, &state, &sync)
		if state != nil {
			sb.state = *state
		}
		if sync != nil {
			sb.sync = *sync
		}
		return sb, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: inspect: %w", err)
	}
	return st.findings(), nil
}

// pgSetup is what Inspect read.
type pgSetup struct {
	recovery   bool
	fsync      string
	syncCommit string
	syncNames  string
	role       string
	seesStats  bool // the role may see the standbys' state (pg_read_all_stats)
	standbys   []pgStandby
}

// pgStandby is one row of pg_stat_replication. state and sync are empty when the role
// may not see them.
type pgStandby struct {
	name, addr, state, sync string
}

func (sb pgStandby) String() string {
	name := sb.name
	if name == "" {
		name = `""`
	}
	if sb.addr != "" {
		name += " (" + sb.addr + ")"
	}
	return name
}

// findings says what the setup means.
func (st *pgSetup) findings() []idempotency.Finding {
	var out []idempotency.Finding
	add := func(level idempotency.FindingLevel, check, setting, detail string) {
		out = append(out, idempotency.Finding{Level: level, Check: check, Setting: setting, Detail: detail})
	}
	const (
		ok, warn, refuse = idempotency.FindingOK, idempotency.FindingWarn, idempotency.FindingRefuse
	)
	if st.recovery {
		add(refuse, CheckRecovery, "pg_is_in_recovery()=true",
			"the server is a standby and takes no writes: every claim fails; point the store at the primary (with several hosts, target_session_attrs=read-write)")
	} else {
		add(ok, CheckRecovery, "pg_is_in_recovery()=false", "the server is a primary: it takes the writes")
	}
	if strings.EqualFold(st.fsync, "off") {
		add(warn, CheckFsync, "fsync=off",
			"commits are not flushed to disk: an OS crash or power loss can lose acknowledged keys, and corrupt the database; they would run again")
	} else {
		add(ok, CheckFsync, "fsync="+st.fsync, "commits are flushed to disk before they are acknowledged")
	}

	spec, parsed := parseSyncNames(st.syncNames)
	named := parsed && spec.num > 0
	namesSetting := "synchronous_standby_names=" + quote(st.syncNames)
	syncCommit := strings.ToLower(st.syncCommit)
	// Whether a commit waits for the synchronous standbys.
	waits := named && (syncCommit == "on" || syncCommit == "remote_write" || syncCommit == "remote_apply")
	scSetting := "synchronous_commit=" + syncCommit
	switch {
	case syncCommit == "off":
		add(warn, CheckSynchronousCommit, scSetting,
			"a commit is acknowledged before it is flushed: a crash of the server can lose the last acknowledged keys, even with no failover; they would run again")
	case syncCommit == "local" && named:
		add(warn, CheckSynchronousCommit, scSetting,
			"commits do not wait for the synchronous standbys: a failover can lose the last completed keys; they would run again")
	case syncCommit == "remote_write" && named:
		add(ok, CheckSynchronousCommit, scSetting,
			"a commit waits until the synchronous standbys have written it, not flushed it: only losing the primary and a standby's OS together can lose it")
	case named:
		add(ok, CheckSynchronousCommit, scSetting, "a commit is acknowledged once the synchronous standbys have flushed it")
	default:
		add(ok, CheckSynchronousCommit, scSetting, "a commit is acknowledged once it is flushed on this server (no synchronous standby is named)")
	}

	hidden := false // a named setup whose standbys' sync_state the role cannot see
	switch {
	case len(st.standbys) == 0 && !named:
		add(ok, CheckStandby, "no standby, "+namesSetting,
			"acknowledged keys survive a crash of this server as long as its disk does; there is no standby to fail over to, and losing the disk loses them all")
	case !named:
		for _, sb := range st.standbys {
			// No standby is named: every one is asynchronous, whether or not the role
			// may see its sync_state.
			add(warn, CheckStandby, "standby "+sb.String()+": sync_state=async",
				"asynchronous standby "+sb.name+": a failover to it can lose the last completed keys; they would run again")
		}
	default:
		for _, sb := range st.standbys {
			setting := "standby " + sb.String() + ": sync_state=" + sb.sync
			if sb.state != "" && sb.state != "streaming" {
				setting += " state=" + sb.state
			}
			switch sb.sync {
			case "sync":
				add(ok, CheckStandby, setting, "synchronous standby "+sb.name+": it has every acknowledged commit, so a failover to it loses no completed key")
			case "quorum":
				add(ok, CheckStandby, setting, fmt.Sprintf("quorum standby %s: each acknowledged commit is on %d of the quorum's standbys, maybe not this one: fail over to the most advanced of them and no completed key is lost", sb.name, spec.num))
			case "potential":
				add(ok, CheckStandby, setting, "potential synchronous standby "+sb.name+": it replaces a synchronous one that is lost, and lags until then: fail over to the synchronous standby, not to it")
			case "async":
				add(warn, CheckStandby, setting, "asynchronous standby "+sb.name+": a failover to it can lose the last completed keys; they would run again")
			default: // hidden from the role
				hidden = true
				add(warn, CheckStandby, "standby "+sb.String()+": sync_state hidden from role "+st.role,
					"cannot tell whether a failover to "+sb.name+" keeps the last completed keys (see "+CheckPrivileges+")")
			}
		}
		out = append(out, st.missing(spec, namesSetting, waits)...)
	}
	switch {
	case hidden:
		add(warn, CheckPrivileges, "role "+st.role+": no pg_read_all_stats",
			fmt.Sprintf("the role cannot see the sync_state of the %d standby(s) connected: GRANT pg_read_all_stats (or pg_monitor) TO %s to have them checked", len(st.standbys), quoteIdent(st.role)))
	case !st.seesStats:
		add(ok, CheckPrivileges, "role "+st.role+": no pg_read_all_stats",
			"the standbys' sync_state would be hidden from the role, which matters once synchronous_standby_names names standbys: GRANT pg_read_all_stats (or pg_monitor) TO "+quoteIdent(st.role)+" to have it checked")
	}
	return out
}

// missing reports the synchronous standbys that spec names and that are not connected.
// When fewer are connected than a commit needs, and commits wait for them (waits),
// every commit waits: the store then reports itself not durable and keyed requests are
// refused until they return.
func (st *pgSetup) missing(spec syncSpec, namesSetting string, waits bool) []idempotency.Finding {
	matches := func(name string) bool {
		for _, n := range spec.names {
			if n == "*" || strings.EqualFold(n, name) {
				return true
			}
		}
		return false
	}
	connected := 0 // standbys streaming that the setting names
	for _, sb := range st.standbys {
		if matches(sb.name) && (sb.state == "" || sb.state == "streaming") {
			connected++
		}
	}
	short := connected < spec.num
	var out []idempotency.Finding
	report := func(what string) {
		f := idempotency.Finding{Check: CheckStandby, Setting: what + " not connected, " + namesSetting}
		switch {
		case short && waits:
			f.Level = idempotency.FindingWarn
			f.Detail = fmt.Sprintf("%d of the %d synchronous standbys a commit needs are connected: every commit waits, so keyed requests are refused (503 store-not-durable) until enough return", connected, spec.num)
		case short:
			f.Level = idempotency.FindingOK
			f.Detail = "commits do not wait for it (synchronous_commit is local or off: see " + CheckSynchronousCommit + ")"
		default:
			f.Level = idempotency.FindingOK
			f.Detail = fmt.Sprintf("the %d connected synchronous standby(s) acknowledge commits meanwhile", connected)
		}
		out = append(out, f)
	}
	wildcard := false
	for _, n := range spec.names {
		if n == "*" {
			wildcard = true
			continue
		}
		found := false
		for _, sb := range st.standbys {
			if strings.EqualFold(sb.name, n) {
				found = true
			}
		}
		if !found {
			report("synchronous standby " + n)
		}
	}
	if wildcard && short && len(out) == 0 {
		report(strconv.Itoa(spec.num-connected) + " synchronous standby(s)")
	}
	return out
}

// syncSpec is synchronous_standby_names parsed: num standbys of names must confirm a
// commit, the first num by priority (FIRST) or any num (ANY).
type syncSpec struct {
	method string // "FIRST" or "ANY"
	num    int
	names  []string // "*" matches any standby
}

// parseSyncNames parses synchronous_standby_names: "", "s1, s2" (FIRST 1), "2 (s1, s2)",
// "FIRST 2 (s1, s2)", "ANY 2 (s1, s2, s3)", names bare or double-quoted, "*" for any.
// ok is false for what it cannot read (the server accepted it, so that would be a form
// this parser does not know).
func parseSyncNames(s string) (spec syncSpec, ok bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return syncSpec{}, true
	}
	spec = syncSpec{method: "FIRST", num: 1}
	if word, rest, found := strings.Cut(s, " "); found && (strings.EqualFold(word, "FIRST") || strings.EqualFold(word, "ANY")) {
		spec.method = strings.ToUpper(word)
		s = strings.TrimSpace(rest)
		if !strings.ContainsRune(s, '(') { // "FIRST" or "ANY" as a standby's name
			spec.method, s = "FIRST", word+" "+rest
		}
	}
	if i := strings.IndexRune(s, '('); i > 0 && strings.HasSuffix(s, ")") {
		n, err := strconv.Atoi(strings.TrimSpace(s[:i]))
		if err != nil || n < 1 {
			return syncSpec{}, false
		}
		spec.num, s = n, s[i+1:len(s)-1]
	}
	names, ok := splitNames(s)
	if !ok || len(names) == 0 {
		return syncSpec{}, false
	}
	spec.names = names
	return spec, true
}

// splitNames splits a comma-separated list of standby names, bare or double-quoted (""
// inside quotes is a quote).
func splitNames(s string) ([]string, bool) {
	var names []string
	for i := 0; i < len(s); {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n') {
			i++
		}
		var b strings.Builder
		if i < len(s) && s[i] == '"' {
			for i++; ; i++ {
				if i >= len(s) {
					return nil, false
				}
				if s[i] == '"' {
					if i+1 < len(s) && s[i+1] == '"' {
						b.WriteByte('"')
						i++
						continue
					}
					i++
					break
				}
				b.WriteByte(s[i])
			}
		} else {
			for i < len(s) && s[i] != ',' {
				b.WriteByte(s[i])
				i++
			}
		}
		name := strings.TrimRightFunc(b.String(), unicode.IsSpace)
		for i < len(s) && s[i] == ' ' {
			i++
		}
		if i < len(s) {
			if s[i] != ',' || strings.TrimSpace(s[i+1:]) == "" {
				return nil, false
			}
			i++
		}
		if name == "" {
			return nil, false
		}
		names = append(names, name)
	}
	return names, true
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }
